"""MAPPO on PettingZoo parallel envs (seed 002 section 4.3): envs.py (adapter, resolve), config.py, trainer.py."""
