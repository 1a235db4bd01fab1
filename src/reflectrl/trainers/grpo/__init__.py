"""GRPO on language models: config.py (GRPO knobs and the LLM run config), trainer.py."""
