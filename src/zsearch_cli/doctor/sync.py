"""Weight sync: perturb the policy, sync it into the engine the trainer's way, and show the
engine now scores like the perturbed policy and unlike the old one.

The perturbation scales the final norm's weight (``model.norm`` in Llama/Qwen/Mistral
layouts; else the last parameter of the last decoder layer) by :data:`SCALE`, which
multiplies every logit's spread: a change of whole nats on any real model, far above
every dtype's tolerance, made by one tensor that the sync must carry. The policy is put
back (and synced again) afterwards, so the check leaves the runtime as it found it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from zsearch_cli.doctor.results import CheckResult
from zsearch_cli.doctor.runtime import Runtime, engine_sequence_logprobs, policy_sequence_logprobs
from zsearch_cli.models.base import logp_tolerance

SCALE = 3.0
MEANINGFUL = 10.0
"""The perturbation must move the probe's logprobs by this many tolerances at least, or the
check cannot tell a sync from none and says so."""


def perturbed_tensor(policy: Any) -> tuple[str, torch.nn.Parameter]:
    """The one parameter the check scales: the final norm's weight, else the last one."""
    named = dict(policy.named_parameters())
    for name in named:
        if name.endswith("model.norm.weight") or name.endswith("final_layernorm.weight") or name.endswith("ln_f.weight"):
            return name, named[name]
    name = next(reversed(named))
    return name, named[name]


def probe_ids(tokenizer: Any) -> list[int]:
    """The trainer's sync probe (a Search-R1 turn), as token ids."""
    from zsearch_cli.train.trainer import SYNC_PROBE

    return list(tokenizer.encode(SYNC_PROBE, add_special_tokens=False))


def check_weight_sync(rt: Runtime, sync: Callable[[], None] | None = None) -> CheckResult:
    """``sync`` (default :meth:`Runtime.sync`) must carry a perturbation of the policy into
    the engine: after it, the engine's probe logprobs equal the perturbed policy's within
    the dtype's tolerance and differ from the old policy's by more."""
    t0 = time.perf_counter()
    sync = sync or rt.sync
    res = CheckResult("weight sync", "")
    ids = probe_ids(rt.tokenizer)
    tol = logp_tolerance(rt.dtype)
    name, param = perturbed_tensor(rt.policy)
    old_policy = policy_sequence_logprobs(rt.policy, ids, rt.device)
    engine_before = engine_sequence_logprobs(rt, ids)
    saved = param.detach().clone()
    try:
        with torch.no_grad():
            param.mul_(SCALE)
        new_policy = policy_sequence_logprobs(rt.policy, ids, rt.device)
        sync()
        engine_after = engine_sequence_logprobs(rt, ids)
    finally:
        with torch.no_grad():
            param.copy_(saved)
    rt.sync()  # the engine back on the unperturbed weights, whatever ``sync`` did
    moved = float((new_policy - old_policy).abs().max())
    to_new = float((engine_after - new_policy).abs().max())
    to_old = float((engine_after - old_policy).abs().max())
    before = float((engine_before - old_policy).abs().max())
    res.details = {"perturbed": f"{name} x{SCALE:g}", "probe_tokens": len(ids), "tolerance": tol,
                   "engine_vs_policy_before": before, "perturbation_moved": moved,
                   "engine_vs_perturbed_after": to_new, "engine_vs_old_after": to_old}
    if moved < MEANINGFUL * tol:
        res.fail(f"scaling {name} by {SCALE:g} moved the probe's logprobs by only {moved:.2e} nats "
                 f"(< {MEANINGFUL:g} x {tol:.0e}): this model cannot show a sync")
    elif to_new > tol:
        res.fail(f"after the sync the engine scores the probe {to_new:.2e} nats from the perturbed policy "
                 f"(tolerance {tol:.0e}) and {to_old:.2e} from the old one: the engine did not take the new weights")
    elif to_old <= tol:
        res.fail(f"after the sync the engine still scores like the old policy ({to_old:.2e} nats)")
    res.summary = (f"{name} x{SCALE:g} moved the probe {moved:.1e}; engine after sync: {to_new:.1e} from new, "
                   f"{to_old:.1e} from old (tol {tol:.0e})")
    res.seconds = time.perf_counter() - t0
    return res
