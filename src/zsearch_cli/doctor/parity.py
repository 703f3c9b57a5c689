"""Parity: do the engine's sampled logprobs equal the trainer's forward of the same tokens?

K prompts are rolled out for several turns through the real engine (``build_engine``, the
chosen backend), then every sampled token is scored again by ``policy_forward``: the
trainer's own forward, dtype, temperature and top-p replay (docs/methods.md §4.1). With
Δ = log π_trainer − log π_engine per sampled token:

* |Δ| mean, p99 and max, overall and by turn (the first turn has a short context; later
  ones read the KV cache across observations, where kernels differ most);
* k3 = E[r − 1 − log r] with r = exp(Δ): an unbiased, non-negative estimate of
  KL(engine ‖ trainer) per token from the engine's own samples (Schulman's k3);
* χ² = E[(r − 1)²]: the variance of the importance weight π_trainer/π_engine, the quantity
  that decides whether ``--rollout-is`` is needed and how hard to cap it;
* the nucleus-mass bias: at top_p < 1 a trainer that did not replay the nucleus would see
  every ratio off by 1/(nucleus mass); reported as mean −log(mass) per token;
* greedy ids of the engine against HF greedy on the policy, with the first diverging
  position; a divergence is a failure only when it is no near tie (the trainer's two
  candidates further apart than the dtype's tolerance).
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np
import torch

from zsearch_cli.doctor.results import CheckResult, parity_thresholds
from zsearch_cli.doctor.runtime import Runtime, policy_sequence_logprobs
from zsearch_cli.models.base import SamplingParams, logp_tolerance

GREEDY_TOKENS = 32
"""Greedy tokens compared per prompt (at most; ``--max-turn-tokens`` if smaller)."""


def turn_index(loss_mask: Sequence[int]) -> list[int]:
    """The turn each response token belongs to: the count of sampled runs (mask 1) started
    before or at it, minus one (observation tokens take the turn they follow)."""
    out, turn, prev = [], -1, 0
    for m in loss_mask:
        if m and not prev:
            turn += 1
        out.append(max(turn, 0))
        prev = m
    return out


def delta_stats(delta: np.ndarray) -> dict[str, float]:
    """|Δ| mean/p99/max, k3 and χ² of per-token Δ = log π_trainer − log π_engine."""
    if delta.size == 0:
        return {"tokens": 0}
    r = np.exp(delta.astype(np.float64))
    a = np.abs(delta)
    return {"tokens": int(delta.size), "mean": float(a.mean()), "p99": float(np.percentile(a, 99)),
            "max": float(a.max()), "k3": float(np.mean(r - 1 - np.log(r))), "chi2": float(np.mean((r - 1) ** 2))}


def suggested_is_cap(delta: np.ndarray) -> float:
    """The smallest ``--rollout-is-cap`` (in steps of 0.5, at least 2, the usual TIS cap)
    that leaves 99.9% of the tokens' weights π_trainer/π_engine uncapped."""
    if delta.size == 0:
        return 2.0
    q = float(np.quantile(np.exp(delta.astype(np.float64)), 0.999))
    return max(2.0, math.ceil(2 * q) / 2)


def rescore(rt: Runtime, trajs: Sequence[Any], temperature: float, top_p: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(trainer logp, engine logp, turn) of every sampled token: the trainer's forward
    (``collate`` + ``policy_forward``) as the old-logprob pass of ``train`` runs it."""
    from zsearch_cli.train.logprobs import collate, policy_forward

    pad = rt.tokenizer.pad_token_id if rt.tokenizer.pad_token_id is not None else 0
    ours, theirs, turns = [], [], []
    for t in trajs:  # one at a time: the same numbers as a padded batch, and no memory spike
        if not any(t.loss_mask):
            continue
        batch = collate([t], int(pad), rt.device)
        with torch.no_grad():
            logp, _ = policy_forward(rt.policy, batch, temperature, top_p=top_p)
        sel = batch.mask[0]
        ours.append(logp[0][sel].double().cpu().numpy())
        theirs.append(np.asarray([lp for lp, m in zip(t.logprobs, t.loss_mask) if m], dtype=np.float64))
        turns.append(np.asarray([k for k, m in zip(turn_index(t.loss_mask), t.loss_mask) if m]))
    if not ours:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=int)
    return np.concatenate(ours), np.concatenate(theirs), np.concatenate(turns)


@torch.no_grad()
def nucleus_bias(rt: Runtime, trajs: Sequence[Any], temperature: float, top_p: float) -> float:
    """Mean −log(nucleus mass) over the sampled tokens: how far each token's ratio would be
    off without the trainer's top-p replay (0 at top_p = 1)."""
    if top_p >= 1.0:
        return 0.0
    from zsearch_cli.train.logprobs import collate, policy_forward

    pad = rt.tokenizer.pad_token_id if rt.tokenizer.pad_token_id is not None else 0
    gaps = []
    for t in trajs:
        if not any(t.loss_mask):
            continue
        batch = collate([t], int(pad), rt.device)
        nucleus, _ = policy_forward(rt.policy, batch, temperature, top_p=top_p)
        full, _ = policy_forward(rt.policy, batch, temperature, top_p=1.0)
        gaps.append((nucleus - full)[batch.mask].double().cpu().numpy())  # log p_nucleus − log p_full = −log mass
    return float(np.concatenate(gaps).mean()) if gaps else 0.0


def greedy_divergence(rt: Runtime, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[dict[str, Any]]:
    """Per prompt: the engine's greedy ids against HF greedy on the policy itself, the first
    diverging position and, there, the trainer's logprob gap between the two picks."""
    from zsearch_cli.models.hf import HFBackend

    params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0)
    engine_out = rt.engine_backend.generate(prompts, params)
    hf_out = HFBackend(rt.policy, rt.tokenizer).generate(prompts, params)
    rows = []
    for prompt, e, h in zip(prompts, engine_out, hf_out):
        at = next((j for j, (a, b) in enumerate(zip(e.token_ids, h.token_ids)) if a != b), None)
        if at is None and len(e.token_ids) != len(h.token_ids):
            at = min(len(e.token_ids), len(h.token_ids))  # one stopped (EOS) where the other went on
        row: dict[str, Any] = {"tokens": len(h.token_ids), "first_divergence": at}
        if at is not None and at < min(len(e.token_ids), len(h.token_ids)):
            context = list(prompt) + list(h.token_ids[:at])
            lp = policy_sequence_logprobs(rt.policy, context + [e.token_ids[at]], rt.device)[-1]
            lh = policy_sequence_logprobs(rt.policy, context + [h.token_ids[at]], rt.device)[-1]
            row["logp_gap"] = float(abs(lp - lh))
        rows.append(row)
    return rows


def check_parity(rt: Runtime, opts: Any, rows: Sequence[Any], search: Any) -> CheckResult:
    """Roll ``rows`` out through ``build_engine`` (``opts.rollout`` as given; ``search`` the
    backend to use) and hold the engine's logprobs to the trainer's forward."""
    from zsearch_cli.rollout.build import build_engine

    t0 = time.perf_counter()
    res = CheckResult("parity", "")
    roll = opts.rollout
    engine = build_engine(opts, backend=rt.engine_backend, search=search)
    trajs = engine.rollout(rows, group_size=1)
    ours, theirs, turns = rescore(rt, trajs, roll.temperature, roll.top_p)
    delta = ours - theirs
    overall = delta_stats(delta)
    by_turn = {int(k): delta_stats(delta[turns == k]) for k in np.unique(turns)}
    dtype = str(rt.dtype).removeprefix("torch.")
    limit = parity_thresholds(rt.dtype)
    cap = suggested_is_cap(delta)
    bias = nucleus_bias(rt, trajs, roll.temperature, roll.top_p)
    greedy = greedy_divergence(rt, [t.prompt_ids for t in trajs], min(GREEDY_TOKENS, roll.max_turn_tokens))
    res.details = {"backend": rt.kind, "dtype": dtype, "temperature": roll.temperature, "top_p": roll.top_p,
                   "prompts": len(trajs), "turns": sorted(by_turn), "overall": overall,
                   "by_turn": by_turn, "thresholds": limit.__dict__, "nucleus_bias_nats_per_token": bias,
                   "suggested_rollout_is_cap": cap, "greedy": greedy}
    if overall["tokens"] == 0:
        res.fail("no sampled token to compare (every rollout was empty)")
        res.summary = "no tokens"
        return res
    for key, bound in (("mean", limit.mean), ("p99", limit.p99), ("max", limit.max)):
        if overall[key] > bound:
            worst = max(by_turn, key=lambda k: by_turn[k].get(key, 0.0))
            res.fail(f"|Δlogp| {key} {overall[key]:.2e} nats > {bound:.0e} ({dtype}; worst in turn {worst}): "
                     f"the {rt.kind} engine does not sample from the weights the trainer scores (a missed weight "
                     "sync, another dtype or a kernel bug)")
            break
    if overall["k3"] > limit.k3:
        res.fail(f"k3-KL(engine ‖ trainer) {overall['k3']:.2e} per token > {limit.k3:.0e} ({dtype})")
    tol = logp_tolerance(rt.dtype)
    for i, g in enumerate(greedy):
        if g.get("logp_gap", 0.0) > tol:
            res.fail(f"greedy ids of prompt {i} diverge from HF at token {g['first_divergence']}, where the "
                     f"trainer's two picks are {g['logp_gap']:.2e} nats apart (no near tie: > {tol:.0e})")
            break
    diverged = [g["first_divergence"] for g in greedy if g["first_divergence"] is not None]
    if diverged and res.ok:
        res.notes.append(f"greedy ids diverge from HF in {len(diverged)}/{len(greedy)} prompts (first at token "
                         f"{min(diverged)}), each at a near tie (≤ {tol:.0e} nats)")
    if overall["max"] <= tol:
        res.notes.append("--rollout-is none is enough: every token's ratio is within the dtype's rounding")
    else:
        res.notes.append(f"suggested --rollout-is token --rollout-is-cap {cap:g} (99.9% of the weights stay uncapped)")
    res.summary = (f"{overall['tokens']} tokens, {len(by_turn)} turns; |Δ| mean {overall['mean']:.1e} "
                   f"p99 {overall['p99']:.1e} max {overall['max']:.1e}; k3 {overall['k3']:.1e} χ² {overall['chi2']:.1e}; "
                   f"greedy {'=' if not diverged else f'≠ at {min(diverged)}'}; nucleus bias {bias:.1e}; cap {cap:g}")
    res.seconds = time.perf_counter() - t0
    return res
