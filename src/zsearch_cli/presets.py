"""``--preset NAME``: the papers' training settings (docs/methods.md §6) as plain option dicts.

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
    # ZeroSearch (Sun et al. 2025): REINFORCE, F1 reward, G = 5, top-5 documents, 5 turns,
    # 200 steps, noise 0 -> 0.25 with base 4 (the Qwen-2.5-3B setting). Its search is the
    # simulator (`--search sim:...`), which the caller chooses; the preset leaves --search.
    "zerosearch": {
        "algo": "reinforce", "lr": 1e-6, "critic_lr": 1e-5, "beta": 0.001, "clip_eps": 0.2,
        "reward": "f1", "group_size": 5, "topk": 5, "max_turns": 5, "steps": 200, "protocol": "tags",
        "max_turn_tokens": 500, "noise_start": 0.0, "noise_end": 0.25, "noise_base": 4.0,
        "noise_schedule": "curriculum",
    },
    # DSPO: the GSPO sequence loss + dynamic filtering, binary subEM, top-3 BM25 passages.
    # Sequence clip ranges, lr and G are the algorithm's defaults (the paper states none).
    "dspo": {
        "algo": "dspo", "reward": "subem", "topk": 3, "search": "bm25", "protocol": "tags",
    },
    # Dr. Zero's solver phase: GRPO, G = 5, EM, tool-call protocol, 5 turns, 50 steps per iteration,
    # 512 new tokens per turn like the proposer (`zsearch solve` = the solve step of `zsearch drzero`).
    "drzero-solver": {
        "algo": "grpo", "group_size": 5, "lr": 1e-6, "reward": "em", "protocol": "tool_call",
        "max_turns": 5, "topk": 3, "steps": 50, "warmup_ratio": 0.03, "max_context_tokens": 3072,
        "max_obs_tokens": 512, "max_turn_tokens": 512,
    },
    # Dr. Zero's proposer phase (Table 5): HRPO (1 question per prompt, no clipping, β = 0),
    # lr 1e-6, warmup 0.03, 5 turns, 4096 tokens; 16 prompts per step, a checkpoint every 10 steps
    # (the `drzero` loop's resume points). Its reward needs the frozen solver, so only
    # `zsearch propose` (and the `drzero` loop) can run it; `zsearch train` refuses hrpo.
    "drzero-proposer": {
        "algo": "hrpo", "group_size": 1, "lr": 1e-6, "beta": 0.0, "protocol": "tool_call", "max_turns": 5,
        "topk": 3, "steps": 50, "warmup_ratio": 0.03, "max_context_tokens": 4096, "max_obs_tokens": 512,
        "max_turn_tokens": 512, "batch_size": 16, "save_every": 10,
    },
}  # fmt: skip


def preset_values(name: str | None) -> dict[str, Any]:
    """The option values of preset ``name`` (empty for None); one-line error if unknown."""
    if not name:
        return {}
    if name not in PRESETS:
        raise ZsearchError(f"unknown --preset {name!r}: use one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])


SIM_ONLY = ("noise_start", "noise_end", "noise_base", "noise_schedule")
"""Preset keys that configure the simulated search only. They are left out when ``--search``
is a real engine (``--preset zerosearch --search bm25`` is the paper's real-search
comparison, not an error) and when the ``--search sim:…?k=v`` spec sets that option itself."""


def apply_preset(name: str | None, options: dict[str, Any], explicit: set[str]) -> dict[str, Any]:
    """``options`` with the preset's values filled in wherever the option is not in
    ``explicit`` (the names the user set on the command line or in a config file)."""
    merged = dict(options)
    values = preset_values(name)
    for key, value in values.items():
        if key not in explicit:
            merged[key] = value
    spec_keys = _sim_spec_keys(merged.get("search") or "bm25")
    for key in SIM_ONLY:
        if key in values and key not in explicit and (spec_keys is None or key in spec_keys):
            merged[key] = None
    return merged


def _sim_spec_keys(search: str) -> set[str] | None:
    """The option names a simulator spec sets (None when ``search`` is not the simulator)."""
    from zsearch_cli.search.factory import is_simulated
    from zsearch_cli.search.simulated import spec_option_names

    return spec_option_names(search.strip()) if is_simulated(search) else None
