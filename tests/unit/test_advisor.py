"""The batching advisor's fit of t(B) = c + m·B and the batch it recommends."""

from __future__ import annotations

import random

import pytest

from mservd.advisor import BatchCosts, Fit, advise, curve, fit_line


def timings(c: float, m: float, sizes, noise: float = 0.0, seed: int = 1):
    rng = random.Random(seed)
    return [(b, c + m * b + rng.gauss(0, noise)) for b in sizes for _ in range(8)]


def test_the_fit_recovers_fixed_and_per_item_cost_from_noisy_timings() -> None:
    fit = fit_line(timings(0.010, 0.002, (1, 2, 4, 8), noise=0.0003))
    assert fit.fixed == pytest.approx(0.010, abs=0.0005)
    assert fit.per_item == pytest.approx(0.002, abs=0.0002)
    assert fit.r2 > 0.95 and fit.samples == 32 and fit.sizes == 4


def test_no_fit_from_one_batch_size_or_too_few_batches() -> None:
    assert fit_line(timings(0.01, 0.002, (4,))) is None  # c and m cannot be told apart
    assert fit_line(timings(0.01, 0.002, (1, 2))[:10]) is None


def test_speedup_curve_and_ceiling_follow_the_formulas() -> None:
    fit = Fit(fixed=0.009, per_item=0.001, r2=1.0, samples=20, sizes=3)
    assert fit.ceiling == pytest.approx(10.0)
    assert fit.speedup(1) == pytest.approx(1.0)
    assert fit.speedup(8) == pytest.approx(8 * 0.010 / 0.017)
    assert fit.throughput(8) == pytest.approx(8 / 0.017)
    assert [p["batchSize"] for p in curve(fit)] == [1, 2, 4, 8, 16, 32, 64]


def test_advice_is_the_smallest_batch_near_the_ceiling_and_a_delay_of_one_fixed_cost() -> None:
    fit = Fit(fixed=0.009, per_item=0.001, r2=1.0, samples=20, sizes=3)
    advice = advise(fit)
    assert advice.batch_size == 64  # 9c/m = 81, capped at the largest advised
    assert advice.max_batch_delay_ms == pytest.approx(9.0)
    compute_bound = Fit(fixed=0.002, per_item=0.025, r2=1.0, samples=20, sizes=3)
    assert advise(compute_bound).batch_size == 1


def test_a_latency_target_caps_the_batch_at_two_batch_times_in_its_budget() -> None:
    fit = Fit(fixed=0.010, per_item=0.005, r2=1.0, samples=20, sizes=3)
    advice = advise(fit, target_s=0.100)  # 2(c + Bm) <= 80 ms → B <= 6
    assert advice.batch_size == 6 and "target" in advice.why
    assert advice.max_batch_delay_ms == pytest.approx(min(10.0, 80 - 2 * 40), abs=0.01)
    impossible = advise(fit, target_s=0.020)
    assert impossible.batch_size == 1 and "cannot be met" in impossible.why


def test_batch_costs_keep_a_recent_window_and_refit_when_it_changes() -> None:
    costs = BatchCosts(window=32)
    for b, t in timings(0.5, 0.5, (1, 2, 4, 8)):  # old, slow
        costs.add(b, t)
    for b, t in timings(0.01, 0.002, (1, 2, 4, 8)):  # recent: only these remain
        costs.add(b, t)
    assert costs.fit().fixed == pytest.approx(0.01, abs=1e-9)
