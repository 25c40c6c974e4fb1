"""The batching advisor's fit of t(B) = c + m·B and the batch it recommends."""

from __future__ import annotations

import dataclasses
import random

import pytest

from mservd.core.advisor import (
    BatchCosts,
    Fit,
    Measured,
    advise,
    curve,
    fit_line,
    ladder,
    next_to_try,
)


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
    advice = advise(fit, target_s=0.100)  # 2(c + Bm) <= 80 ms → B <= 6: the rung below
    assert advice.batch_size == 4 and "target" in advice.why
    assert advice.max_batch_delay_ms == pytest.approx(min(10.0, 80 - 2 * 30), abs=0.01)
    impossible = advise(fit, target_s=0.020)
    assert impossible.batch_size == 1 and "cannot be met" in impossible.why


def test_batch_costs_keep_a_recent_window_and_refit_when_it_changes() -> None:
    costs = BatchCosts(window=32)
    for b, t in timings(0.5, 0.5, (1, 2, 4, 8)):  # old, slow
        costs.add(b, t)
    for b, t in timings(0.01, 0.002, (1, 2, 4, 8)):  # recent: only these remain
        costs.add(b, t)
    assert costs.fit().fixed == pytest.approx(0.01, abs=1e-9)


def measured_from(per_batch: dict[int, float], batches: int = 8) -> dict[int, Measured]:
    costs = BatchCosts()
    for size, seconds in per_batch.items():
        for _ in range(batches):
            costs.add(size, seconds)
    return costs.measured()


def test_batches_are_measured_by_their_size() -> None:
    costs = BatchCosts()
    for size, seconds in ((4, 0.03), (4, 0.05), (8, 0.08), (3, 0.02)):
        costs.add(size, seconds)
    measured = costs.measured()
    assert sorted(measured) == [3, 4, 8]
    assert (measured[4].batches, measured[4].items) == (2, 8)
    assert measured[4].throughput == pytest.approx(8 / 0.08)
    assert measured[4].to_dict()["batchMs"] == pytest.approx(40.0)


def test_only_full_batches_measure_their_size() -> None:
    costs = BatchCosts()
    for _ in range(8):
        costs.add(8, 0.08)
        costs.add(4, 0.01, full=False)  # a short batch in a quiet moment: not a batch size's
    assert sorted(costs.measured()) == [8]
    assert costs.fit() is not None  # but it shapes the line


def test_sizes_advised_are_powers_of_two_and_the_largest() -> None:
    assert ladder(64) == [1, 2, 4, 8, 16, 32, 64]
    assert ladder(6) == [1, 2, 4, 6]
    assert ladder(1) == [1]
    measured = measured_from({3: 0.01, 4: 0.1})  # a size off the ladder is not advised
    assert advise(None, measured=measured).batch_size == 4


def test_measured_sizes_overrule_the_line_and_a_smaller_one_close_to_the_best_wins() -> None:
    line = Fit(fixed=0.002, per_item=0.025, r2=0.99, samples=64, sizes=4)  # ceiling 1.08
    assert advise(line).batch_size == 1
    # per item: 27 ms alone, 23 ms in batches of 8, 30 ms in batches of 16 (caches)
    measured = measured_from({1: 0.027, 2: 0.052, 4: 0.098, 8: 0.184, 16: 0.48})
    advice = advise(line, measured=measured)
    assert advice.batch_size == 8 and "the most measured" in advice.why
    assert advice.max_batch_delay_ms == pytest.approx(2.0)
    close = measured_from({4: 0.0925, 8: 0.184})  # 4 answers 43.2 req/s, 8 answers 43.5
    assert advise(line, measured=close).batch_size == 4


def test_a_size_measured_too_slow_for_the_target_is_not_advised() -> None:
    measured = measured_from({4: 0.1, 8: 0.15, 16: 0.25})
    advice = advise(None, target_s=0.4, measured=measured)  # 2 x 250 ms > 320 ms
    assert advice.batch_size == 8 and "target" in advice.why
    assert advice.max_batch_delay_ms is None  # no line yet: the delay set stays


def test_with_every_size_measured_past_the_target_the_next_smaller_is_advised() -> None:
    advice = advise(None, target_s=0.1, measured=measured_from({4: 0.06, 8: 0.1}))
    assert advice.batch_size == 2 and "pass 80% of the 100 ms target" in advice.why


def test_each_unmeasured_neighbour_of_the_advice_is_tried_larger_first() -> None:
    measured = measured_from({4: 0.1})
    advice = advise(None, measured=measured)
    assert next_to_try(advice, None, None, 64, measured) == 8
    measured = measured_from({4: 0.1, 8: 0.22})
    advice = advise(None, measured=measured)
    assert advice.batch_size == 4 and next_to_try(advice, None, None, 64, measured) == 2
    measured = measured_from({2: 0.06, 4: 0.1, 8: 0.22})
    assert next_to_try(advise(None, measured=measured), None, None, 64, measured) is None
    assert next_to_try(advise(None, measured=measured_from({4: 0.1})), None, None, 4,
                       measured_from({4: 0.1})) == 2  # never past the largest allowed
    # twice 100 ms may take 200: two of those pass 80 % of a 300 ms target, so only half
    assert next_to_try(advise(None, measured=measured_from({4: 0.1})), None, 0.3, 64,
                       measured_from({4: 0.1})) == 2


def test_the_search_finds_the_fastest_size_that_the_line_cannot_show() -> None:
    """Batches run at a per-item cost that falls to batch 8 and rises past it; sized every 8
    batches from a start of 2, the search settles on 8 and keeps measuring its neighbours."""
    per_item = {1: 0.027, 2: 0.026, 4: 0.0245, 8: 0.023, 16: 0.030, 32: 0.034, 64: 0.036}
    costs = BatchCosts()
    size, advised, ran = 2, [], []
    for _ in range(160):
        for _ in range(8):
            costs.add(size, 0.002 + per_item[size] * size)
        measured = costs.measured()
        advice = advise(costs.fit(), measured=measured)
        size = next_to_try(advice, costs.fit(), None, 64, measured) or advice.batch_size
        advised.append(advice.batch_size)
        ran.append(size)
    assert advised[-80:].count(8) == 80
    assert set(ran[-80:]) == {4, 8, 16}  # its neighbours are measured again as they age out
    assert ran[-80:].count(8) >= 0.85 * 80


def test_the_line_is_followed_past_the_sizes_measured_while_it_promises_more() -> None:
    line = Fit(fixed=0.020, per_item=0.002, r2=0.99, samples=64, sizes=3)  # knee at 90
    measured = measured_from({8: 0.036, 16: 0.052})  # batches of 32 untried
    advice = advise(line, measured=measured)
    assert advice.batch_size == 64 and "measured up to 16" in advice.why
    measured = measured_from({8: 0.036, 16: 0.052, 32: 0.2})  # tried: 32 was slow
    assert advise(line, measured=measured).batch_size == 16



def test_a_line_that_explains_little_is_not_followed_past_the_sizes_measured() -> None:
    """Every full batch of 8 (12 ms + 2 ms a request): the line through them and a few short
    ones is noise (r² 0.02) and promises batches of 24. The advice stays at the size measured
    and the search tries the next rung alone; once it is measured too slow, 8 stays."""
    noise = Fit(fixed=0.028, per_item=0.0003, r2=0.02, samples=256, sizes=3)
    measured = measured_from({8: 0.028})
    advice = advise(noise, target_s=0.1, largest=24, measured=measured)
    assert advice.batch_size == 8 and "not followed" in advice.why
    assert next_to_try(advice, noise, 0.1, 24, measured) == 16
    measured = measured_from({8: 0.028, 16: 0.044})  # two of 44 ms pass 80 ms
    advice = advise(noise, target_s=0.1, largest=24, measured=measured)
    assert advice.batch_size == 8 and next_to_try(advice, noise, 0.1, 24, measured) is None
    # the same line explaining the timings is followed to the largest batch the target allows
    line = dataclasses.replace(noise, r2=0.9)
    assert advise(line, target_s=0.1, largest=24, measured=measured_from({8: 0.028})
                  ).batch_size == 24


def test_a_size_the_line_rules_out_is_not_tried() -> None:
    hops = Fit(fixed=0.002, per_item=0.0001, r2=0.99, samples=64, sizes=3)  # 20 items a hop
    measured = measured_from({8: 0.0028})
    advice = advise(hops, largest=8, measured=measured)
    assert advice.batch_size == 8
    # batches of 4 would answer 31 % less by the line: measuring that costs, teaches nothing
    assert next_to_try(advice, hops, None, 8, measured) is None
