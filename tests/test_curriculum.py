"""ZeroSearch's noise curriculum (eq. 1): analytic values of p(t) and the per-call draws."""

from __future__ import annotations

import math

import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.search.curriculum import NoiseCurriculum, noise_probability


def test_endpoints_are_p_start_and_p_end():
    # t = 0: (4^0 − 1)/(4 − 1) = 0/3 = 0 → p = p_s.
    assert noise_probability(0, 200, 0.0, 0.75) == pytest.approx(0.0)
    assert noise_probability(0, 200, 0.25, 0.5) == pytest.approx(0.25)
    # t = T: (4^1 − 1)/(4 − 1) = 3/3 = 1 → p = p_e.
    assert noise_probability(200, 200, 0.0, 0.75) == pytest.approx(0.75)
    assert noise_probability(200, 200, 0.25, 0.5) == pytest.approx(0.5)


def test_midpoint_with_base_4():
    # t/T = 0.5: (4^0.5 − 1)/(4 − 1) = (2 − 1)/3 = 1/3 → p = p_s + (p_e − p_s)/3.
    assert noise_probability(100, 200, 0.0, 0.75) == pytest.approx(0.75 / 3)  # = 0.25
    assert noise_probability(100, 200, 0.25, 0.5) == pytest.approx(0.25 + 0.25 / 3)
    # t/T = 0.25: (4^0.25 − 1)/3 = (√2 − 1)/3 ≈ 0.13807 (convex: below the linear 0.25).
    assert noise_probability(50, 200, 0.0, 1.0) == pytest.approx((math.sqrt(2) - 1) / 3)


def test_other_bases_and_the_linear_limit():
    # b = 2, t/T = 0.5: (√2 − 1)/(2 − 1) = √2 − 1 ≈ 0.41421.
    assert noise_probability(1, 2, 0.0, 1.0, base=2.0) == pytest.approx(math.sqrt(2) - 1)
    # b = 1 is 0/0 in eq. 1; its limit is the linear ramp t/T: 0.3 at t/T = 0.3.
    assert noise_probability(3, 10, 0.0, 1.0, base=1.0) == pytest.approx(0.3)
    # …and bases next to 1 approach it continuously.
    assert noise_probability(3, 10, 0.0, 1.0, base=1.0 + 1e-7) == pytest.approx(0.3, abs=1e-6)
    with pytest.raises(ZsearchError, match="base"):
        noise_probability(1, 2, 0.0, 1.0, base=0.0)


def test_t_over_T_is_clamped():
    # t > T behaves as t = T (p_e); t < 0 as t = 0 (p_s).
    assert noise_probability(500, 200, 0.1, 0.6) == pytest.approx(0.6)
    assert noise_probability(-5, 200, 0.1, 0.6) == pytest.approx(0.1)


def test_zero_total_steps():
    # T = 0 (progress unknown, e.g. outside training): step 0 → p_s, any later step → p_e.
    assert noise_probability(0, 0, 0.2, 0.7) == pytest.approx(0.2)
    assert noise_probability(3, 0, 0.2, 0.7) == pytest.approx(0.7)


def test_fixed_schedule_is_p_start_everywhere():
    # The paper's "random" ablation: p = 0.5 at every step.
    for t in (0, 37, 100, 250):
        assert noise_probability(t, 100, 0.5, 0.9, schedule="fixed") == 0.5
    with pytest.raises(ZsearchError, match="schedule"):
        noise_probability(0, 10, 0.0, 1.0, schedule="linear")


def test_curriculum_validates_probabilities():
    with pytest.raises(ZsearchError, match="p_end"):
        NoiseCurriculum(p_start=0.0, p_end=1.5)


@pytest.mark.parametrize("step,expected", [(0, 0.0), (50, 0.75 / 3), (100, 0.75)])
def test_draw_frequencies_match_p(step, expected):
    # Over 20,000 seeded draws the noisy fraction is within ~4 standard errors of p(t):
    # sd = sqrt(p(1−p)/n) ≤ sqrt(0.25/20000) ≈ 0.0035.
    cur = NoiseCurriculum(p_start=0.0, p_end=0.75, seed=7)
    cur.set_progress(step, 100)
    assert cur.p == pytest.approx(expected)
    n = 20_000
    noisy = sum(cur.draw(f"row{i}", i % 5, "same query")[1] == "noisy" for i in range(n))
    assert noisy / n == pytest.approx(expected, abs=0.015)


def test_draws_depend_only_on_the_call_identity():
    a = NoiseCurriculum(p_start=0.5, p_end=0.5, seed=3)
    b = NoiseCurriculum(p_start=0.5, p_end=0.5, seed=3)
    a.set_progress(4, 10)
    b.set_progress(4, 10)
    calls = [("r1", 0, "q one"), ("r2", 1, "q two"), ("r3", 0, "q three")]
    # b sees other rows first and in another order: r1/r2/r3's draws must not change.
    first = {c: a.draw(*c) for c in calls}
    b.draw("other", 0, "unrelated")
    second = {c: b.draw(*c) for c in reversed(calls)}
    assert first == second
    # A repeated identical query of one sample gets the next call index, hence a new draw;
    # a new step resets the counters and changes every draw.
    u0, _ = a.draw("r1", 0, "q one")
    assert u0 == a.uniform("r1", 0, "q one", 1) != a.uniform("r1", 0, "q one", 0)
    a.set_progress(5, 10)
    assert a.next_call_index("r1", 0, "q one") == 0
    assert a.uniform("r1", 0, "q one", 0) != first[calls[0]][0]
    # another seed gives other draws
    assert NoiseCurriculum(seed=4).uniform("r1", 0, "q one", 0) != NoiseCurriculum(seed=3).uniform("r1", 0, "q one", 0)
