"""PPO on Gymnasium envs: config.py (knobs, per-env defaults), resolve.py (resolve, eval policy), trainer.py."""
