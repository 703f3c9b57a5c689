"""``--preset NAME``: the papers' training settings (FORMULAS §6) as plain option dicts.

A preset only fills options the user did not set: a flag on the command line (or a key in
``--config FILE``) always wins. Keys are :class:`~zsearch_cli.train.config.TrainConfig` field
names. Values the table leaves blank ("—") are not set here, so the algorithm's own defaults
(``algos/*.py``, also from the papers) apply; notably the group size G: PPO samples 1 response
per prompt and GRPO 5, which are Search-R1's values for both of its options.
"""

from __future__ import annotations

from typing import Any

from zsearch_cli.errors import ZsearchError

PRESETS: dict[str, dict[str, Any]] = {
    # Search-R1 (Jin et al. 2025): PPO by default, GRPO with G = 5 as the option (--algo grpo).
    "search-r1": {
        "algo": "ppo", "lr": 1e-6, "critic_lr": 1e-5, "beta": 0.001, "clip_eps": 0.2,
        "reward": "em", "topk": 3, "max_turns": 4, "steps": 500, "protocol": "tags",
        "max_turn_tokens": 500, "max_obs_tokens": 500,
    },
    # ZeroSearch (Sun et al. 2025): REINFORCE, F1 reward, G = 5, top-5 documents. Its search is
    # the simulator (`--search sim:...`), which the caller chooses; the preset leaves --search.
    "zerosearch": {
        "algo": "reinforce", "lr": 1e-6, "critic_lr": 1e-5, "beta": 0.001, "clip_eps": 0.2,
        "reward": "f1", "group_size": 5, "topk": 5, "max_turns": 5, "steps": 200, "protocol": "tags",
        "max_turn_tokens": 500,
    },
    # DSPO: the GSPO sequence loss + dynamic filtering, binary subEM, top-3 BM25 passages.
    # Sequence clip ranges, lr and G are the algorithm's defaults (the paper states none).
    "dspo": {
        "algo": "dspo", "reward": "subem", "topk": 3, "search": "bm25", "protocol": "tags",
    },
    # Dr. Zero's solver phase: GRPO, G = 5, EM, tool-call protocol, 5 turns, 50 steps per iteration.
    "drzero-solver": {
        "algo": "grpo", "group_size": 5, "lr": 1e-6, "reward": "em", "protocol": "tool_call",
        "max_turns": 5, "topk": 3, "steps": 50, "warmup_ratio": 0.03, "max_context_tokens": 3072,
        "max_obs_tokens": 512,
    },
}  # fmt: skip


def preset_values(name: str | None) -> dict[str, Any]:
    """The option values of preset ``name`` (empty for None); one-line error if unknown."""
    if not name:
        return {}
    if name not in PRESETS:
        raise ZsearchError(f"unknown --preset {name!r}: use one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def apply_preset(name: str | None, options: dict[str, Any], explicit: set[str]) -> dict[str, Any]:
    """``options`` with the preset's values filled in wherever the option is not in
    ``explicit`` (the names the user set on the command line or in a config file)."""
    merged = dict(options)
    for key, value in preset_values(name).items():
        if key not in explicit:
            merged[key] = value
    return merged
