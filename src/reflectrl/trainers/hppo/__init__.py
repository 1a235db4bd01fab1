"""Two-level PPO (seed 002 section 6.1): goals.py (goal space, resolve), config.py, trainer.py."""
