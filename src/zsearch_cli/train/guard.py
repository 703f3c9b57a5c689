"""Collapse guard, the detection half: watch each step's metrics row against a running
baseline and report the signs of RL collapse (reward falling to zero, gibberish, entropy or
response length exploding, grad-norm or KL spikes, NaN). docs/stability.md says what each
check means, why each default, and what the trainer does with an event (warn / stop /
rollback). Pure stdlib, so it costs nothing to import and well under 1% of a step to run.

Baseline rule: per metric, the **median of the last ``baseline_window`` healthy steps**. A
median ignores the odd noisy step that stays below every threshold (an EMA of the mean would
be dragged by it), follows a slow healthy drift with a lag of about half the window, and is
a plain list of numbers in ``state_dict``. A step that raised any event adds nothing to any
baseline: one bad metric often leads the others (a grad spike before the reward falls), and
a collapse must not drag its own baseline down with it. That alone does not catch a reward
that falls slower than the window lags (0.35 -> 0 over 150 steps never sits 60% below a
25-step-old median), so ``reward_drop`` compares against the reward's **peak baseline**: the
highest its healthy median has been. A falling training reward is never healthy (a harder
curriculum aside: docs/stability.md); length, entropy and KL legitimately drift and keep the
plain median.
"""

from __future__ import annotations

import math
import re
import statistics
import unicodedata
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Any


@dataclass(frozen=True)
class GuardConfig:
    """Thresholds, all relative to the running baseline ``b`` of their metric (with an
    absolute floor or margin where a ratio alone would alarm on numbers near zero). The
    defaults are set so that a small, noisy but healthy run (batch of tens of samples) does
    not trip them; tests/test_guard.py measures the margin."""

    warmup_steps: int = 5
    """No check but ``nonfinite`` runs until a metric's baseline holds this many healthy
    steps: a median of 5 is already robust to one odd value, and collapse comes at step 150+."""
    baseline_window: int = 50
    """The baseline is the median of this many latest healthy steps: long enough that noise
    barely moves it, short enough (25-step lag) to follow a healthy drift in length or KL."""
    smooth_window: int = 5
    """Level checks (reward, length, truncation, entropy collapse, garbage, format) compare the
    mean of the last 5 steps, alarm steps included: a 40-sample batch's reward has a step std
    of ~0.06-0.1, 5 steps cut that by 2.2x; a real collapse is still caught within 3-4 steps."""
    reward_drop_frac: float = 0.6
    """reward_drop: smoothed reward below ``b - max(0.6*|b|, reward_drop_abs)``, b the peak
    baseline (the highest the reward's healthy median has been, so a slow fall fires); collapse
    takes the reward to ~0, 60% leaves >3 sigma for a small run's noise at b ~ 0.3."""
    reward_drop_abs: float = 0.15
    """...and by at least 0.15 (rewards are EM/F1 in [0, 1]): early in training a small run's
    reward of ~0.15 has a 5-step-mean noise of ~0.03 plus a slow wander, and its peak is
    biased up by that noise; 0.1 tripped there in the tests, 0.15 leaves ~4 sigma."""
    length_ratio: float = 3.0
    """length_blowup: smoothed response_length above 3x b. Healthy length drifts (the lag of
    the window covers ~1.5x growth over 25 steps); a collapse runs to the token cap."""
    truncated_abs: float = 0.25
    """length_blowup: smoothed truncated_frac (share of samples at the token cap) above 25%..."""
    truncated_margin: float = 0.15
    """...and 0.15 above b, so a run whose budget always truncates a few is not flagged."""
    entropy_ratio: float = 3.0
    """entropy_spike: entropy (this step) above 3x b (gibberish: a near-uniform next token);
    entropy_collapse: smoothed entropy below b/3 (a mode collapse within a few dozen steps;
    a healthy decline is slow and the baseline follows it)..."""
    entropy_spike_margin: float = 1.0
    """...and at least 1 nat above b: gibberish from a real vocabulary has several nats per
    token, while a small model that is learning swings between 0.2 and 0.9 nats (the suite's
    DSPO learning run: 5.9x its baseline of 0.16, healthy)."""
    entropy_drop_abs: float = 0.2
    """...entropy_collapse also needs a drop of at least 0.2 nats: a ratio between two small
    entropies is noise (the suite's warmed toy policies at 0.08-0.15 nats settle to 0.01-0.04
    as they converge; a real policy at 0.5 nats falling to 0.15 has collapsed)."""
    improving_margin: float = 0.05
    """The precursor checks (entropy, KL and grad norm) stay quiet while the reward improves:
    its 5-step mean more than 0.05 above its baseline. A policy that finds the reward moves
    fast (the suite's learning runs: grad norms of 20-100x their median, entropy 6x, KL 15x,
    all while the reward climbs); a collapse shows them with the reward flat or falling. The
    margin is above a 5-step mean's noise at a plateau (~0.03), so there they stay armed."""
    garbage_abs: float = 0.01
    """garbage: smoothed garbage_frac above 1% of characters (healthy text has ~0)..."""
    garbage_ratio: float = 5.0
    """...and 5x b, for corpora whose text legitimately carries a few odd characters."""
    repeat_abs: float = 0.3
    """garbage: smoothed repeat_frac (repeated 4-grams) above 0.3 (a loop gives ~0.9; the
    repeated tags of a multi-turn agent give ~0.05-0.15)..."""
    repeat_ratio: float = 2.0
    """...and 2x b."""
    kl_ratio: float = 5.0
    """kl_spike: kl_ref (this step) above 5x b; KL to the reference grows slowly in a healthy
    run, so 5x of a 25-step-old median means a sudden jump..."""
    kl_floor: float = 1.0
    """...and above 1 nat per token: a policy that learns fast legitimately moves 0.1-0.5 nats
    from its reference within tens of steps (the suite's GRPO learning run: 0.52 at 15x its
    median), while a collapsed policy writing gibberish sits several nats away."""
    grad_ratio: float = 10.0
    """grad_blowup: the mean grad_norm of the last 5 steps above 10x b: a sustained blow-up.
    Healthy grad norms are heavy-tailed: single steps of 20-40x the median occur when a small
    policy finds the reward (the suite's learning runs), so one step alone is not enough..."""
    grad_step_ratio: float = 100.0
    """...grad_spike: one step above 100x b (collapse reports show 10-100x and more)..."""
    grad_floor: float = 2.0
    """...and both above 2 (grad_blowup) and 10 (grad_spike, 5x this) in absolute terms: the
    pre-clip norm of a blow-up runs far past the default clip of 1.0, while a converged policy
    whose median norm is ~0.04 (zero advantages almost everywhere) shows healthy steps of 100x
    that median that are still below 4 (the suite's REINFORCE learning run)."""
    logp_ratio: float = 4.0
    """logp_mismatch: sampler-vs-trainer logprob gap (this step) above 4x b..."""
    logp_floor: float = 0.01
    """...and above 0.01 nats per token (bf16 kernels legitimately differ by ~1e-3..1e-2;
    the trainer's own hard stop at LOGP_TOLERANCE stays in force)."""
    invalid_margin: float = 0.5
    """format_failure: smoothed invalid actions per sample more than 0.5 above b..."""
    unanswered_margin: float = 0.25
    """...or the smoothed answered share more than 0.25 below b (a quarter of the samples
    stopped answering)."""

    def validate(self) -> None:
        """Raise ValueError with one line naming the first bad field."""
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("warmup_steps", "baseline_window", "smooth_window"):
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise ValueError(f"GuardConfig.{f.name} must be an integer >= 1, got {v!r}")
            elif not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"GuardConfig.{f.name} must be a finite number >= 0, got {v!r}")
            elif f.name.endswith("_ratio") and v <= 1:
                raise ValueError(f"GuardConfig.{f.name} must be > 1 (a multiple of the baseline), got {v!r}")
        if self.warmup_steps > self.baseline_window:
            raise ValueError(f"GuardConfig.warmup_steps ({self.warmup_steps}) must be <= baseline_window "
                             f"({self.baseline_window})")
        if self.reward_drop_frac > 1:
            raise ValueError(f"GuardConfig.reward_drop_frac must be <= 1, got {self.reward_drop_frac!r}")


@dataclass
class GuardEvent:
    """One check that fired at one step (``baseline``/``threshold`` are None for nonfinite)."""

    step: int
    check: str
    metric: str
    value: float
    baseline: float | None
    threshold: float | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (NaN/inf become the strings "nan", "inf", "-inf")."""
        d = asdict(self)
        for k in ("value", "baseline", "threshold"):
            if isinstance(d[k], float) and not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


@dataclass(frozen=True)
class _Check:
    name: str
    metric: str
    smooth: bool  # compare the mean of the last smooth_window steps, else this step's value
    above: bool  # fires when the value is above the threshold, else below
    threshold: Callable[[float, GuardConfig], float | None]  # (baseline, cfg) -> threshold
    peak: bool = False  # the baseline is the highest the median has been (reward_drop)
    precursor: bool = False  # quiet while the reward improves (GuardConfig.improving_margin)


def _ratio(b: float, k: float) -> float | None:
    return k * b if b > 0 else None


CHECKS: tuple[_Check, ...] = (
    _Check("reward_drop", "rollout/reward_mean", True, False,
           lambda b, c: b - max(c.reward_drop_frac * abs(b), c.reward_drop_abs), peak=True),
    _Check("length_blowup", "rollout/response_length", True, True, lambda b, c: _ratio(b, c.length_ratio)),
    _Check("length_blowup", "rollout/truncated_frac", True, True,
           lambda b, c: max(c.truncated_abs, b + c.truncated_margin)),
    _Check("entropy_spike", "actor/entropy", False, True,
           lambda b, c: max(c.entropy_ratio * b, b + c.entropy_spike_margin) if b > 0 else None, precursor=True),
    _Check("entropy_collapse", "actor/entropy", True, False,
           lambda b, c: min(b / c.entropy_ratio, b - c.entropy_drop_abs) if b > 0 else None, precursor=True),
    _Check("garbage", "rollout/garbage_frac", True, True, lambda b, c: max(c.garbage_abs, c.garbage_ratio * b)),
    _Check("garbage", "rollout/repeat_frac", True, True, lambda b, c: max(c.repeat_abs, c.repeat_ratio * b)),
    _Check("kl_spike", "actor/kl_ref", False, True, lambda b, c: max(c.kl_floor, c.kl_ratio * b), precursor=True),
    _Check("grad_spike", "actor/grad_norm", False, True,
           lambda b, c: max(c.grad_step_ratio * b, 5 * c.grad_floor), precursor=True),
    _Check("grad_blowup", "actor/grad_norm", True, True,
           lambda b, c: max(c.grad_ratio * b, c.grad_floor), precursor=True),
    _Check("logp_mismatch", "rollout/logp_mismatch", False, True, lambda b, c: max(c.logp_floor, c.logp_ratio * b)),
    _Check("format_failure", "rollout/invalid", True, True, lambda b, c: b + c.invalid_margin),
    _Check("format_failure", "rollout/answered", True, False, lambda b, c: b - c.unanswered_margin),
)  # fmt: skip
"""Every check: several may share a name (one per metric) or a metric (entropy both ways)."""

PEAK_METRICS = frozenset(c.metric for c in CHECKS if c.peak)

WATCHED: tuple[str, ...] = tuple(dict.fromkeys(
    [c.metric for c in CHECKS] + ["actor/loss", "actor/pg_loss", "actor/approx_kl", "critic/vf_loss",
                                  "critic/grad_norm"]))
"""Metrics a NaN/inf in fires ``nonfinite`` (the checked ones and the losses)."""


class CollapseGuard:
    """Feed it every step's metrics row (``observe``); it returns the events that fired.

    ``healthy`` is whether the last observed step raised none; ``closeness`` maps
    ``"check:metric"`` to how far the last step's value went from the baseline towards the
    threshold (0 = at the baseline, 1 = at the threshold, where the check fires)."""

    def __init__(self, cfg: GuardConfig | None = None):
        self.cfg = cfg or GuardConfig()
        self.cfg.validate()
        self.healthy = True
        self.last_step: int | None = None
        self.closeness: dict[str, float] = {}
        self._healthy_values: dict[str, deque[float]] = {}
        self._recent: dict[str, deque[float]] = {}
        self._peak: dict[str, float] = {}

    def baseline(self, metric: str) -> float | None:
        """The metric's baseline (median of its healthy window), None before it has any value."""
        values = self._healthy_values.get(metric)
        return statistics.median(values) if values else None

    def observe(self, step: int, row: dict[str, float | None]) -> list[GuardEvent]:
        """Check one metrics row; a metric that is None or absent is skipped. Returns the
        events (empty: a healthy step, whose values then join the baselines)."""
        cfg = self.cfg
        events: list[GuardEvent] = []
        values: dict[str, float] = {}
        for m in WATCHED:
            v = row.get(m)
            if v is None or isinstance(v, bool):
                continue
            v = float(v)
            if math.isfinite(v):
                values[m] = v
            else:
                events.append(GuardEvent(step, "nonfinite", m, v, None, None,
                                         f"step {step}: nonfinite: {m} is {v}"))
        for m, v in values.items():
            self._recent.setdefault(m, deque(maxlen=cfg.smooth_window)).append(v)
        self.closeness = {}
        improving = self._improving()
        for check in CHECKS:
            history = self._healthy_values.get(check.metric)
            if check.metric not in values or history is None or len(history) < cfg.warmup_steps:
                continue
            if check.precursor and improving:
                continue
            b = statistics.median(history)
            b = self._peak.get(check.metric, b) if check.peak else b
            thr = check.threshold(b, cfg)
            if thr is None or thr == b:
                continue
            recent = self._recent[check.metric]
            v = sum(recent) / len(recent) if check.smooth else values[check.metric]
            self.closeness[f"{check.name}:{check.metric}"] = (v - b) / (thr - b)
            if (v > thr) if check.above else (v < thr):
                what = f"mean of last {len(recent)} steps" if check.smooth else "this step"
                events.append(GuardEvent(
                    step, check.name, check.metric, v, b, thr,
                    f"step {step}: {check.name}: {check.metric} {v:.4g} ({what}) is "
                    f"{'above' if check.above else 'below'} threshold {thr:.4g} "
                    f"({'peak ' if check.peak else ''}baseline {b:.4g})"))
        if not events:
            for m, v in values.items():
                window = self._healthy_values.setdefault(m, deque(maxlen=cfg.baseline_window))
                window.append(v)
                if m in PEAK_METRICS and len(window) >= cfg.warmup_steps:
                    self._peak[m] = max(self._peak.get(m, -math.inf), statistics.median(window))
        self.healthy = not events
        self.last_step = step
        return events

    def _improving(self) -> bool:
        """The reward's mean over the last steps is more than ``improving_margin`` above its
        baseline (the policy is finding the reward; the precursor checks wait)."""
        metric = "rollout/reward_mean"
        history, recent = self._healthy_values.get(metric), self._recent.get(metric)
        if not history or not recent or len(history) < self.cfg.warmup_steps:
            return False
        return sum(recent) / len(recent) > statistics.median(history) + self.cfg.improving_margin

    def state_dict(self) -> dict[str, Any]:
        """Everything ``observe`` depends on, JSON-serialisable (for the checkpoint)."""
        return {"version": 1, "last_step": self.last_step, "healthy": self.healthy,
                "baseline": {m: list(d) for m, d in self._healthy_values.items()},
                "recent": {m: list(d) for m, d in self._recent.items()}, "peak": dict(self._peak)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s output (windows cut to this config's lengths)."""
        if not isinstance(state, dict) or state.get("version") != 1:
            raise ValueError("CollapseGuard.load_state_dict: not a version-1 guard state")
        try:
            baseline = {str(m): deque((float(x) for x in xs), maxlen=self.cfg.baseline_window)
                        for m, xs in state["baseline"].items()}
            recent = {str(m): deque((float(x) for x in xs), maxlen=self.cfg.smooth_window)
                      for m, xs in state["recent"].items()}
            peak = {str(m): float(x) for m, x in state["peak"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"CollapseGuard.load_state_dict: malformed guard state ({e})") from None
        self._healthy_values, self._recent, self._peak = baseline, recent, peak
        self.last_step = state.get("last_step")
        self.healthy = bool(state.get("healthy", True))
        self.closeness = {}


# --- text-quality metrics -------------------------------------------------------------------

ALLOWED_CONTROL = "\t\n\r"
"""Control characters that are ordinary layout (\\r too: CRLF text copied from documents)."""


_BAD_CATEGORIES = frozenset({"Cc", "Co", "Cs", "Cn"})
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def _is_garbage(ch: str) -> bool:
    return ch == "\ufffd" or (unicodedata.category(ch) in _BAD_CATEGORIES and ch not in ALLOWED_CONTROL)


@lru_cache(maxsize=1)
def _bmp_garbage() -> re.Pattern[str]:
    """Runs of garbage characters of the Basic Multilingual Plane, as one character class
    built once (~20 ms) from unicodedata. BMP only, because then ``re`` tests membership with
    a bitmap; a class that also spans the astral planes is a list of ~700 ranges scanned per
    character, 50x slower (2.3 s instead of 40 ms for 4.7M characters)."""
    ranges: list[list[int]] = []
    for cp in range(0x10000):
        if _is_garbage(chr(cp)):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1][1] = cp
            else:
                ranges.append([cp, cp])
    return re.compile("[" + "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges) + "]+")


def garbage_frac(texts: Sequence[str]) -> float:
    """Share of all characters of ``texts`` (pooled) that are garbage: Unicode categories Cc
    (control, except ALLOWED_CONTROL), Co (private use), Cs (lone surrogates, e.g. from a
    surrogateescape decode), Cn (unassigned in this Python's Unicode database) and U+FFFD,
    the replacement character a detokenizer writes for invalid UTF-8. 0.0 for no characters.

    Letters of any script count as text: a multilingual model writing Chinese or Cyrillic
    must not alarm. Mixed scripts within a word are not counted either: Chinese writes Latin
    names without spaces ("用Python写"), so that rule would alarm on healthy text;
    multilingual token salad shows up instead in entropy, repeat_frac and the reward."""
    total = sum(len(t) for t in texts)
    if not total:
        return 0.0
    joined = "\n".join(texts)
    bad = sum(len(run) for run in _bmp_garbage().findall(joined))
    bad += sum(1 for ch in _ASTRAL.findall(joined) if _is_garbage(ch))  # rare: emoji, CJK ext.
    return bad / total


def repeat_frac(token_ids: Sequence[Sequence[int]], n: int = 4) -> float:
    """Mean over samples of the share of a sample's n-grams that repeat an earlier n-gram of
    the same sample (an n-gram seen c times counts c - 1). A loop ("the the the ...") gives
    ~1, ordinary text ~0. Samples shorter than n have no n-grams and are left out of the
    mean; 0.0 when no sample has any."""
    if n < 1:
        raise ValueError(f"repeat_frac: n must be >= 1, got {n}")
    shares = []
    for ids in token_ids:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids  # numpy / torch: hash plain ints
        count = len(ids) - n + 1
        if count > 0:
            shares.append((count - len(set(zip(*(ids[i:] for i in range(n)))))) / count)
    return sum(shares) / len(shares) if shares else 0.0


def text_metrics(texts: Sequence[str], token_ids: Sequence[Sequence[int]], n: int = 4) -> dict[str, float]:
    """Both text metrics under their metrics-row names (``rollout/garbage_frac``,
    ``rollout/repeat_frac``), for the trainer to merge into the row."""
    return {"rollout/garbage_frac": garbage_frac(texts), "rollout/repeat_frac": repeat_frac(token_ids, n)}
