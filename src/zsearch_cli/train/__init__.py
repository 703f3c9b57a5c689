"""RL training for search agents: one loop (``Trainer``) for every ``--algo``.

``TrainConfig`` holds the options, ``Trainer(cfg).train()`` runs them; ``presets`` fills in
the papers' settings. Modules: config, sampler (prompt order), step_samples
(rollout/reward/filter), logprobs, update (advantages + optimization), optim, policy
(policy, reference, critic), distributed, checkpoint, metrics, validation.
"""

from zsearch_cli.train.config import TrainConfig, check_config

__all__ = ["TrainConfig", "Trainer", "check_config", "run_training"]


def __getattr__(name: str):  # lazy: importing the config must not import torch
    if name in ("Trainer", "run_training"):
        from zsearch_cli.train import trainer

        return getattr(trainer, name)
    raise AttributeError(name)
