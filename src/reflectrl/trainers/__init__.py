"""The trainers: one shared layer and one package per trainer, each registered in reflectrl/registry.py.

Shared layer (used by every trainer; names no trainer):
  base.py                the train loop, the loop hooks of an env-step trainer, checkpoint helpers, apply_signals
  resolve.py             a new run's config resolved: the env probed once, the trainer's resolve, every check
  policies.py, cnn.py    actor-critic policies (MLP, CNN) and params_sha256
  streams.py             value heads of the signals' own reward streams
  exploration_metrics.py the exploration state keys of a rollout and the metrics counted on them
  onpolicy/              the clipped on-policy learner: one config (OnPolicyConfig), one update (clipped_update)

One package per trainer, each owning its config (knobs and defaults), resolve, policies and loop:
  ppo/ (PPO), replay/ (DQN and SAC with the replay buffer), impala/ (IMPALA's actors and learner),
  mappo/ (MAPPO and its PettingZoo envs), hppo/ (two-level PPO and its goal space), grpo/ (GRPO on
  language models and the LLM run's config).

A new trainer is its own package (anywhere importable) plus one TrainerSpec registration.
"""
