"""The clipped on-policy learner PPO, MAPPO and HPPO share: config.py (OnPolicyConfig), update.py (clipped_update)."""
