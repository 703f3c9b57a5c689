"""What every doctor check returns: a :class:`CheckResult` (a verdict, one table cell of
numbers, the details for ``doctor.json`` and one line per failure), and the parity
thresholds by dtype (the reasons are in docs/commands/doctor.md, "Thresholds")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zsearch_cli.models.base import LOGP_TOLERANCE


@dataclass
class CheckResult:
    """One check's outcome: a pass, or the reasons it failed, printed as one line that names
    the check before ``zsearch doctor`` exits non-zero."""

    name: str
    summary: str
    """The table's cell: the few numbers a person reads first."""
    details: dict[str, Any] = field(default_factory=dict)
    """Everything measured, for doctor.json (plain JSON values)."""
    reasons: list[str] = field(default_factory=list)
    """Why the check failed (empty: it passed); :attr:`failures` joins them into its one line."""
    notes: list[str] = field(default_factory=list)
    """Advice that is no failure (a suggested --rollout-is-cap, a near tie in greedy ids)."""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def failures(self) -> list[str]:
        """The one line ``zsearch doctor`` prints for this check when it failed (none when it
        passed): its name, then every reason."""
        return [f"{self.name}: {'; '.join(self.reasons)}"] if self.reasons else []

    def fail(self, message: str) -> None:
        self.reasons.append(message)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "summary": self.summary, "failures": self.failures,
                "notes": self.notes, "seconds": round(self.seconds, 3), "details": self.details}


@dataclass(frozen=True)
class ParityThresholds:
    """How far the engine's logprob of a sampled token may be from the trainer's forward of
    the same token, in nats: mean, 99th percentile and max of |Δ logp|, and the k3 estimate
    of KL(engine ‖ trainer) per token."""

    mean: float
    p99: float
    max: float
    k3: float


PARITY_THRESHOLDS = {
    # fp32: both sides are log-softmaxes of the same fp32 logits; measured on vLLM's CPU build:
    # mean 1.6e-6 / max 1.5e-5 (tiny model), mean 9.9e-6 / p99 1.6e-4 / max 5.4e-4 (smollm2, 298
    # tokens, top_p 0.9). The max of N tokens grows with N and depth, hence 5x the trainer's
    # sync guard (LOGP_TOLERANCE, one 40-token probe) for the max; p99 at the guard itself.
    "float32": ParityThresholds(mean=1e-4, p99=LOGP_TOLERANCE["float32"], max=5 * LOGP_TOLERANCE["float32"], k3=1e-6),
    # bf16: 8 bits of mantissa; published vLLM-vs-FSDP comparisons show per-token gaps of 1e-2 on
    # average and rare tokens off by up to ~1 nat. NOT measured here (no GPU): a starting point.
    "bfloat16": ParityThresholds(mean=2e-2, p99=LOGP_TOLERANCE["bfloat16"] * 3, max=2.0, k3=2e-3),
    "float16": ParityThresholds(mean=5e-3, p99=LOGP_TOLERANCE["float16"] * 3, max=1.0, k3=5e-4),
}


def parity_thresholds(dtype: Any) -> ParityThresholds:
    """:data:`PARITY_THRESHOLDS` for a dtype name or ``torch.dtype`` (fp32's for anything else)."""
    return PARITY_THRESHOLDS.get(str(dtype).removeprefix("torch."), PARITY_THRESHOLDS["float32"])
