"""IMPALA: actors (actor.py) in a pool (pool.py) feeding one V-trace learner (trainer.py); config.py."""
