"""The replay trainers: DQN and SAC (dqn.py, sac.py) on one loop (base.py) and buffer (buffer.py);
config.py (knobs), resolve.py (resolve, eval policies)."""
