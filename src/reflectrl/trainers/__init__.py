"""The trainers: one shared layer and one package per trainer, each registering itself in its __init__.

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
  language models and the LLM run's config), ppo_jax/ (PPO's form on backend=jax: compiled with JAX).

A new trainer is its own package (anywhere importable) plus one TrainerSpec registration, in its
__init__ (which imports no torch: the parts are named by module path). Importing this package loads the
built-in ones' registrations, in the order --algo lists them (as Gymnasium's envs/__init__ registers its
envs); `import reflectrl` does it.
"""

from reflectrl.trainers import ppo, replay, impala, mappo, hppo, grpo, ppo_jax  # noqa: F401, I001 (registrations)
