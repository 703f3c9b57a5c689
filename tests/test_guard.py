"""The collapse guard (train/guard.py, docs/stability.md): quiet on healthy noisy runs, each
check fires on its planted collapse within a stated number of steps, alarm steps never move
the baseline, NaN fires at once, missing metrics are skipped, the state survives a resume,
and the two text metrics give hand-computed values. Pure Python: no model, no torch."""

from __future__ import annotations

import json
import math
import random

import pytest

from zsearch_cli.train.guard import (CHECKS, CollapseGuard, GuardConfig, GuardEvent, garbage_frac, repeat_frac,
                                     text_metrics)

# metric: (level, log-scale?, walk sigma, observation noise, lower, upper). The level follows a
# mean-reverting random walk (AR(1), pull 0.05/step); each step's value adds observation noise.
# Noise is that of a *small* run (tens of samples per step): reward step std ~0.07, grad norm
# lognormal with sigma 0.5 (single steps at 4x the median happen in 300 steps).
SPEC = {
    "rollout/reward_mean": (0.35, False, 0.01, 0.06, 0.0, 1.0),
    "rollout/response_length": (450.0, True, 0.02, 0.08, 1.0, 4096.0),
    "rollout/truncated_frac": (0.03, False, 0.003, 0.025, 0.0, 1.0),
    "actor/entropy": (0.9, True, 0.02, 0.06, 0.0, 20.0),
    "rollout/garbage_frac": (0.0005, False, 0.0, 0.0005, 0.0, 1.0),
    "rollout/repeat_frac": (0.1, False, 0.005, 0.03, 0.0, 1.0),
    "actor/kl_ref": (0.01, True, 0.03, 0.2, 0.0, 100.0),
    "actor/grad_norm": (0.4, True, 0.02, 0.5, 0.0, 1e9),
    "rollout/logp_mismatch": (0.004, True, 0.02, 0.25, 0.0, 10.0),
    "rollout/invalid": (0.15, False, 0.01, 0.1, 0.0, 10.0),
    "rollout/answered": (0.9, False, 0.005, 0.05, 0.0, 1.0),
    "actor/loss": (0.0, False, 0.0, 0.05, -10.0, 10.0),
}
STEPS = 300
ONSET = 200


def series(seed: int, steps: int = STEPS, trend: dict[str, tuple[float, float]] | None = None) -> list[dict]:
    """Healthy metric rows for steps 1..steps; ``trend`` moves a metric's level linearly
    (in log space for log metrics) from a start to an end value over the run."""
    rng = random.Random(seed)
    walk = {m: 0.0 for m in SPEC}
    rows = []
    for step in range(1, steps + 1):
        row: dict = {"step": step}
        for m, (level, log, ws, noise, lo, hi) in SPEC.items():
            if trend and m in trend:
                a, b = trend[m]
                t = (step - 1) / (steps - 1)
                level = math.exp(math.log(a) + t * (math.log(b) - math.log(a))) if log else a + t * (b - a)
            walk[m] += -0.05 * walk[m] + ws * rng.gauss(0, 1)
            if log:
                v = level * math.exp(walk[m] + noise * rng.gauss(0, 1))
            else:
                v = level + walk[m] + noise * rng.gauss(0, 1)
            row[m] = min(max(v, lo), hi)
        rows.append(row)
    return rows


def run(rows: list[dict], guard: CollapseGuard | None = None) -> tuple[CollapseGuard, list[GuardEvent]]:
    guard = guard or CollapseGuard()
    events = []
    for row in rows:
        events += guard.observe(row["step"], row)
    return guard, events


TRENDS = {  # a run that learns: reward rises, length grows, entropy falls, KL to the reference grows
    "rollout/reward_mean": (0.1, 0.5), "rollout/response_length": (300.0, 700.0),
    "actor/entropy": (1.2, 0.5), "actor/kl_ref": (0.001, 0.08), "rollout/truncated_frac": (0.01, 0.07),
}


@pytest.mark.parametrize("trend", [None, TRENDS], ids=["flat", "learning"])
def test_healthy_noisy_run_raises_nothing_and_reports_margin(trend):
    # 10 seeds x 300 steps of realistic small-run noise: the defaults must stay quiet. The
    # margin is the worst "closeness" (0 = at the baseline, 1 = at the threshold) any step
    # reached, per check: printed (pytest -s) and bounded so that a default tightened into
    # the noise fails here even when no seed happens to cross it.
    worst: dict[str, float] = {}
    for seed in range(10):
        guard = CollapseGuard()
        for row in series(seed, trend=trend):
            assert guard.observe(row["step"], row) == [], f"seed {seed}"
            for key, c in guard.closeness.items():
                worst[key] = max(worst.get(key, -math.inf), c)
    print(f"\nworst closeness to threshold ({'learning' if trend else 'flat'}, 10 seeds x {STEPS} steps):")
    for key in sorted(worst):
        print(f"  {key:45s} {worst[key]:.2f}")
    assert set(worst) == {f"{c.name}:{c.metric}" for c in CHECKS}  # every check ran
    assert max(worst.values()) < 0.8, worst


PLANTED = [  # (check, metric, collapsed value from ONSET on, steps after onset it may take)
    # smoothed checks need enough collapsed steps to move the 5-step mean past the threshold:
    ("reward_drop", "rollout/reward_mean", 0.0, 4),  # mean 0.35*(5-k)/5 < 0.14 at k=4 (+1 for noise)
    ("length_blowup", "rollout/response_length", 4096.0, 2),  # (450*3 + 4096*2)/5 > 1350 at k=2
    ("length_blowup", "rollout/truncated_frac", 0.8, 2),  # (0.03*3 + 0.8*2)/5 = 0.34 > 0.25 at k=2
    ("entropy_spike", "actor/entropy", 4.0, 0),  # raw: 4.0 > 3 x 0.9 on the first step
    ("entropy_collapse", "actor/entropy", 0.1, 4),  # (0.9 + 0.1*4)/5 = 0.26 < 0.3 at k=4
    ("garbage", "rollout/garbage_frac", 0.2, 0),  # 0.2/5 = 0.04 > 0.01 on the first step
    ("garbage", "rollout/repeat_frac", 0.9, 2),  # (0.1*3 + 0.9*2)/5 = 0.42 > 0.3 at k=2
    ("kl_spike", "actor/kl_ref", 3.0, 0),  # raw: 3 nats > max(1, 5 x b) on the first step
    ("grad_spike", "actor/grad_norm", 80.0, 0),  # raw: 80 > 100 x ~0.44 on the first step
    ("grad_blowup", "actor/grad_norm", 15.0, 1),  # under 100x; mean (0.44*3 + 15*2)/5 = 6.3 > 4.4 at k=1
    ("logp_mismatch", "rollout/logp_mismatch", 0.1, 0),
    ("format_failure", "rollout/invalid", 2.0, 2),  # (0.15*3 + 2*2)/5 = 0.89 > 0.65 at k=2
    ("format_failure", "rollout/answered", 0.2, 2),  # (0.9*3 + 0.2*2)/5 = 0.62 < 0.65 at k=2
]


@pytest.mark.parametrize("check,metric,value,delay", PLANTED, ids=[f"{c}:{m}" for c, m, _, _ in PLANTED])
def test_each_check_fires_on_its_planted_collapse(check, metric, value, delay):
    # Only the one metric collapses at ONSET: the first event must come at or after ONSET
    # (no false alarm before) and within `delay` steps, name that metric and that check.
    rows = series(seed=0)
    for row in rows[ONSET - 1:]:
        row[metric] = value
    guard, events = run(rows)
    assert events, f"{check} never fired"
    first = events[0]
    assert ONSET <= first.step <= ONSET + delay, first.message
    assert (first.check, first.metric) == (check, metric), first.message
    assert first.value == pytest.approx(first.value) and first.threshold is not None
    assert f"step {first.step}" in first.message and metric in first.message and check in first.message
    assert not guard.healthy


def test_alarm_steps_do_not_move_the_baseline():
    # Response length jumps from ~450 to 1600 tokens (3.5x) at step 100 and stays there: it
    # fires once the 5-step mean passes 3 x 450 = 1350 ((450 + 4 x 1600)/5 = 1370 at step 103,
    # +1 for the noise of the baseline) and must keep firing to the end. Were alarm steps added to the
    # baseline, its median would reach 1600 within ~25 steps and the alarm would stop: the
    # blow-up would become the new normal.
    rows = series(seed=1)
    for row in rows[99:]:
        row["rollout/response_length"] = 1600.0
    guard, events, frozen = CollapseGuard(), [], None
    for row in rows:
        events += guard.observe(row["step"], row)
        if events and frozen is None:  # the windows as they stood after the first alarm step
            frozen = guard.state_dict()["baseline"]
    steps = [e.step for e in events if e.check == "length_blowup"]
    assert 100 <= steps[0] <= 104
    assert steps == list(range(steps[0], STEPS + 1))  # every step after the first alarm
    assert {e.baseline for e in events} == {events[0].baseline} and events[0].baseline < 600  # frozen
    assert guard.state_dict()["baseline"] == frozen  # no window took a value from an alarm step


def test_slowly_falling_reward_still_fires_to_the_end():
    # A slow collapse: reward falls linearly from ~0.35 (step 100) to 0 (step 250). The median
    # lags the fall by ~25 steps, so a median baseline would slide down with it and never
    # fire; the peak baseline (~0.35-0.4) fires when the 5-step mean passes ~0.15 (step ~188),
    # and the last steps (reward ~0) still fire against that same peak.
    rows = series(seed=2)
    for row in rows[99:]:
        row["rollout/reward_mean"] = max(0.0, 0.35 * (1 - (row["step"] - 100) / 150)) + 0.01 * ((row["step"] % 3) - 1)
    _, events = run(rows)
    drop = [e for e in events if e.check == "reward_drop"]
    assert drop and 175 <= drop[0].step <= 200 and drop[-1].step == STEPS
    assert drop[-1].baseline == drop[0].baseline > 0.3


def test_nonfinite_fires_at_step_one_even_in_warmup():
    guard = CollapseGuard()
    events = guard.observe(1, {"actor/loss": float("nan"), "actor/grad_norm": float("inf"),
                               "rollout/reward_mean": 0.3})
    assert [(e.step, e.check, e.metric) for e in events] == [
        (1, "nonfinite", "actor/grad_norm"), (1, "nonfinite", "actor/loss")]  # WATCHED order
    assert not guard.healthy
    assert "actor/loss is nan" in events[1].message
    # JSON-safe for the events jsonl, NaN written as a string; a nonfinite value never joins a baseline
    assert json.loads(json.dumps(events[1].to_dict()))["value"] == "nan"
    assert guard.baseline("actor/grad_norm") is None and guard.baseline("rollout/reward_mean") is None


def test_no_check_before_warmup():
    # a 160x grad norm on step 3 is within warmup (the baseline has 2 values): no event;
    # the same spike after warmup fires (one step over 100x the median 0.5; and the 5-step
    # mean (0.4 + 80 + 0.5 + 0.45 + 80)/5 = 32 is over 10x it too)
    guard = CollapseGuard(GuardConfig(warmup_steps=5))
    for step, g in enumerate([0.5, 0.4, 80.0, 0.5, 0.45], start=1):
        assert guard.observe(step, {"actor/grad_norm": g}) == []
    assert [e.check for e in guard.observe(6, {"actor/grad_norm": 80.0})] == ["grad_spike", "grad_blowup"]


def test_missing_and_none_metrics_are_skipped():
    rows = series(seed=3, steps=60)
    guard, events = run(rows[:30])
    assert events == []
    before = guard.baseline("rollout/reward_mean")
    for row in rows[30:]:  # reward not logged for 30 steps (None), length absent altogether
        row["rollout/reward_mean"] = None
        del row["rollout/response_length"]
        assert guard.observe(row["step"], row) == []
        assert not any(k.endswith("rollout/reward_mean") or k.endswith("response_length") for k in guard.closeness)
    assert guard.baseline("rollout/reward_mean") == before  # untouched
    assert guard.baseline("actor/entropy") is not None
    assert CollapseGuard().observe(1, {}) == [] and CollapseGuard().observe(1, {"actor/loss": None}) == []


def test_state_dict_round_trip_continues_identically():
    # Resume at step 150 through JSON: the resumed guard must give the same events and the
    # same closeness on every later step as the guard that never stopped, through a collapse
    # at step 220. Dropping either window (baseline or smoothing) in the state would change
    # the closeness right after the resume.
    rows = series(seed=4)
    for row in rows[219:]:
        row["actor/entropy"] = 5.0
    a, _ = run(rows[:150])
    b = CollapseGuard()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    fresh = CollapseGuard()
    diverged = False
    for row in rows[150:]:
        ea, eb = a.observe(row["step"], row), b.observe(row["step"], row)
        assert [e.to_dict() for e in ea] == [e.to_dict() for e in eb]
        assert a.closeness == b.closeness and a.healthy == b.healthy
        fresh.observe(row["step"], row)
        diverged |= fresh.closeness != a.closeness
    assert diverged  # the state mattered
    assert a.state_dict() == b.state_dict()
    assert any(e.check == "entropy_spike" for e in a.observe(301, {**rows[-1], "step": 301}))
    with pytest.raises(ValueError, match="version-1"):
        b.load_state_dict({"version": 2})


def test_config_validation_is_one_line():
    GuardConfig().validate()
    for bad in (dict(warmup_steps=0), dict(grad_ratio=1.0), dict(kl_floor=-1.0), dict(smooth_window=2.5),
                dict(warmup_steps=60, baseline_window=50), dict(reward_drop_frac=1.5), dict(logp_floor=math.nan)):
        with pytest.raises(ValueError) as e:
            CollapseGuard(GuardConfig(**bad))
        assert "\n" not in str(e.value) and "GuardConfig." in str(e.value)


def test_garbage_frac_hand_values():
    assert garbage_frac(["abc\x00"]) == 0.25  # one NUL in four characters
    assert garbage_frac(["ab\n\t", "\ufffd\ue000cd"]) == 2 / 8  # U+FFFD and private use; \n \t are fine
    assert garbage_frac(["a\ud800", "\u0378b"]) == 0.5  # a lone surrogate, an unassigned code point
    assert garbage_frac(["a\x1b[31mb\x7f"]) == 2 / 8  # ESC and DEL
    assert garbage_frac(["用Python写代码 привет Ωμέγα 😀 ok\r\n"]) == 0.0  # any script is text
    assert garbage_frac(["\U000f0000x\U0001f600"]) == 1 / 3  # astral private use counts, an emoji does not
    assert garbage_frac([]) == 0.0 and garbage_frac(["", ""]) == 0.0


def test_repeat_frac_hand_values():
    # [1,2,3,4]x3, n=4: 9 four-grams, the 4 distinct ones first, the last 5 repeat: 5/9
    assert repeat_frac([[1, 2, 3, 4] * 3]) == pytest.approx(5 / 9)
    assert repeat_frac([[1, 2, 3, 4, 5, 6]]) == 0.0
    assert repeat_frac([[7] * 10]) == pytest.approx(6 / 7)  # "the the the ...": 7 four-grams, 1 distinct
    assert repeat_frac([[1, 2, 3, 4] * 3, [1, 2, 3, 4, 5]]) == pytest.approx((5 / 9 + 0) / 2)  # mean over samples
    assert repeat_frac([[1, 2], [7] * 10]) == pytest.approx(6 / 7)  # too short for a 4-gram: left out
    assert repeat_frac([[1, 1, 2]], n=1) == pytest.approx(1 / 3)
    assert repeat_frac([]) == 0.0 and repeat_frac([[1, 2]]) == 0.0
    with pytest.raises(ValueError):
        repeat_frac([[1]], n=0)
    assert text_metrics(["abc\x00"], [[7] * 10]) == {"rollout/garbage_frac": 0.25,
                                                      "rollout/repeat_frac": pytest.approx(6 / 7)}


def test_precursors_wait_while_the_reward_improves():
    # A 160x grad norm (its 5-step mean 33x), 6x entropy and a 3-nat KL while the reward's 5-step mean is 0.3 above
    # its median (a small policy finding the reward, as in the suite's learning runs): no
    # event. The same values with the reward flat: all three fire. The reward's own checks
    # never wait.
    def rows(reward_after: float) -> list[dict]:
        out = []
        for step in range(1, 31):
            spike = step >= 26
            out.append({"step": step, "rollout/reward_mean": 0.1 if step < 22 else reward_after,
                        "actor/grad_norm": 80.0 if spike else 0.5, "actor/entropy": 3.0 if spike else 0.5,
                        "actor/kl_ref": 3.0 if spike else 0.01})
        return out

    _, climbing = run(rows(0.4))
    assert climbing == []
    _, flat = run(rows(0.1))
    assert {e.check for e in flat if e.step == 26} == {"grad_spike", "grad_blowup", "entropy_spike", "kl_spike"}
