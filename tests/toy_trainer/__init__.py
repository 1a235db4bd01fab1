"""A toy trainer written only from the trainer kit's shared parts, for
tests/test_new_trainer.py: its own files plus one registration make it a trainer."""
