"""Multi-agent training on PettingZoo parallel envs (seed 002 section 4.3): the env adapter
(envs.py), MAPPO (mappo.py) and its knobs (config.py). See docs/multiagent.md."""
