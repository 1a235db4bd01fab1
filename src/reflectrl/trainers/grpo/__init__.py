"""GRPO on language models: config.py (GRPO knobs and the LLM run config), trainer.py; its registration
(this file imports no torch or transformers)."""

from reflectrl.registry import TrainerSpec, register_trainer

register_trainer(TrainerSpec(
    "grpo", "llm", ("token", "turn"), frozenset({"features", "teacher"}),
    "GRPO on language models (group-normalised advantages, clipped token objective)",
    entry="reflectrl.trainers.grpo.trainer:GRPOTrainer", config="reflectrl.trainers.grpo.config:GRPOConfig"))
