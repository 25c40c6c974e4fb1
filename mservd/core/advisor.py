"""The batching advisor: what one batch of a model version costs, and the batch it should run.

A batch of ``B`` requests takes ``t(B) = c + m·B`` seconds: ``c`` paid once per batch (the hop
to the worker and back, the handler's fixed work, a kernel launch) and ``m`` per request. The
controller fits ``c`` and ``m`` to each version's recent batch timings by least squares
(:class:`BatchCosts`); from the fit follow the speed-up of batching ``S(B) = B(c+m)/(c+Bm)``, its
ceiling ``1 + c/m``, a worker's throughput ``B/(c+Bm)``, and the batch size and delay that
serve the model best within its latency target (:func:`advise`).

The line is a model's shape, not its measure: a compute-bound model's per-item cost falls up to
some batch size and rises past it (caches), which no line shows. So the timings are also kept by
size (:class:`Measured`), and once sizes have been measured the advice is the one that answered
the most per worker. Sizes advised are powers of two (and the largest allowed): a ladder whose
rungs are far enough apart to tell apart under noise. With ``batchSize: auto`` or a latency
target (``maxLatencyMs``) the scheduler applies the advice as it goes and tries each rung next to
the advised one (:func:`next_to_try`) whenever its measure has aged out of the window — a search
that follows the model as the machine's load changes.

Pure arithmetic: no clock, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass

WINDOW = 256  # recent batches the fit is made from
MIN_SAMPLES = 16  # fewer batches than this: no fit yet
LARGEST_BATCH = 64  # the most the advisor recommends
SHARE_OF_CEILING = 0.9  # a batch worth running reaches this share of S's ceiling
TARGET_SHARE = 0.8  # of a latency target, what two batch times and the delay may use
MIN_AT_SIZE = 8  # batches of about one size before its throughput counts as measured
CLOSE_ENOUGH = 0.97  # a smaller batch answering this share of the most measured is advised
RULED_OUT = 0.9  # a size the line expects to answer less than this share of the advised one's
# is not tried: the line is trusted where it is steep, measured where it is flat
MIN_R2 = 0.5  # a line explaining less of the timings than this leads nowhere past the sizes
# measured: batches nearly all of one size, or noise as large as what the size changes, give a
# line that noise alone tilts (tiny's r² is 0.26-0.39)


@dataclass(frozen=True)
class Fit:
    """``t(B) = fixed + per_item·B`` seconds, fitted to ``samples`` batches of ``sizes``
    distinct sizes; ``r2`` is the share of the timings' variance the line explains."""

    fixed: float
    per_item: float
    r2: float
    samples: int
    sizes: int

    def seconds(self, batch: int) -> float:
        return self.fixed + self.per_item * batch

    def speedup(self, batch: int) -> float:
        """How many times faster per request a batch of ``batch`` is than batches of one."""
        return batch * self.seconds(1) / self.seconds(batch)

    @property
    def ceiling(self) -> float:
        """The speed-up no batch size passes: ``1 + c/m``."""
        return 1.0 + self.fixed / self.per_item

    def throughput(self, batch: int) -> float:
        """Requests a second one worker answers in batches of ``batch``."""
        return batch / self.seconds(batch)

    def to_dict(self) -> dict[str, float | int]:
        return {"fixedMs": round(self.fixed * 1e3, 4), "perItemMs": round(self.per_item * 1e3, 4),
                "r2": round(self.r2, 4), "samples": self.samples, "batchSizes": self.sizes,
                "speedupCeiling": round(self.ceiling, 2)}


@dataclass(frozen=True)
class Measured:
    """What the recent batches of ``size`` did: ``batches`` of them answered ``items`` (their
    size times their count) in ``seconds`` of batch time."""

    size: int
    batches: int
    items: int
    seconds: float

    @property
    def throughput(self) -> float:
        """Requests a second one worker answered in these batches."""
        return self.items / self.seconds if self.seconds > 0 else math.inf

    @property
    def batch_seconds(self) -> float:
        return self.seconds / self.batches

    @property
    def enough(self) -> bool:
        """Enough recent batches (MIN_AT_SIZE) for its throughput to count."""
        return self.batches >= MIN_AT_SIZE

    def to_dict(self) -> dict[str, float | int]:
        return {"batchSize": self.size, "batches": self.batches, "items": self.items,
                "batchMs": round(self.batch_seconds * 1e3, 3),
                "throughput": round(self.throughput, 2)}


def ladder(largest: int) -> list[int]:
    """The sizes advised: powers of two below ``largest``, and ``largest``."""
    return [1 << k for k in range(largest.bit_length()) if 1 << k < largest] + [largest]


class BatchCosts:
    """The recent batch timings of one version, the line through them, and what each size
    did."""

    def __init__(self, window: int = WINDOW) -> None:
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)
        self.full: deque[tuple[int, float]] = deque(maxlen=window)  # full batches alone
        self._fit: Fit | None = None
        self._stale = False
        self._measured: dict[int, Measured] = {}

    def add(self, size: int, seconds: float, full: bool = True) -> None:
        """A batch's timing; ``full`` when it filled the batch size in force. Every batch
        shapes the line, only full ones measure their size: a short batch runs when the queue
        is short, in a quiet moment, and would flatter its size against the full ones of a
        busy one."""
        if size > 0 and seconds >= 0:
            self.samples.append((size, seconds))
            self._stale = True
            if full:
                self.full.append((size, seconds))
                self._measured = {}

    def measured(self) -> dict[int, Measured]:
        """Each batch size among the recent full batches, with how many there were."""
        if not self._measured and self.full:
            sums: dict[int, list[float]] = {}
            for size, seconds in self.full:
                acc = sums.setdefault(size, [0, 0.0])
                acc[0] += 1
                acc[1] += seconds
            self._measured = {b: Measured(b, int(n), b * int(n), t)
                              for b, (n, t) in sorted(sums.items())}
        return self._measured

    def fit(self) -> Fit | None:
        """The least-squares line, or None until there are MIN_SAMPLES batches of at least
        two sizes (one size cannot tell ``c`` from ``m``). While the recent batches are all of
        one size (a batch size of one advised, say) the last line found stands."""
        if self._stale:
            self._fit = fit_line(list(self.samples)) or self._fit
            self._stale = False
        return self._fit


def fit_line(samples: list[tuple[int, float]]) -> Fit | None:
    n = len(samples)
    sizes = len({b for b, _ in samples})
    if n < MIN_SAMPLES or sizes < 2:
        return None
    mean_b = sum(b for b, _ in samples) / n
    mean_t = sum(t for _, t in samples) / n
    sbb = sum((b - mean_b) ** 2 for b, _ in samples)
    sbt = sum((b - mean_b) * (t - mean_t) for b, t in samples)
    stt = sum((t - mean_t) ** 2 for _, t in samples)
    slope = sbt / sbb
    # noise can tilt the line below zero; a batch never costs less per item than nothing
    per_item = max(slope, 1e-7)
    fixed = max(mean_t - per_item * mean_b, 0.0)
    r2 = (sbt * sbt / (sbb * stt)) if stt > 0 else 1.0
    return Fit(fixed, per_item, r2 if slope > 0 else 0.0, n, sizes)


@dataclass(frozen=True)
class Advice:
    batch_size: int
    max_batch_delay_ms: float | None  # None: nothing to judge it by yet (keep the one set)
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"batchSize": self.batch_size, "maxBatchDelay": self.max_batch_delay_ms,
                "why": self.why}


def advise(fit: Fit | None, target_s: float | None = None, largest: int = LARGEST_BATCH,
           measured: dict[int, Measured] | None = None) -> Advice:
    """The batch size and delay that serve the model best (see the module).

    Measured sizes of the ladder first: the smallest whose throughput per worker is within 3 %
    of the most measured. Before any is measured, and while the fit's advice is larger than
    that, the rung above it untried and the fit explains at least half the timings' variance
    (``MIN_R2``; else the search measures the rungs above one at a time), the fit's: the
    smallest batch that reaches 90 % of the speed-up's ceiling (``B ≥ 9c/m``), down to a rung
    of the ladder — larger ones add latency for little. Under a latency target a request may
    wait for the batch in progress, then run in its own, so two batch times and the delay must
    fit in 80 % of the target. The delay is at most one fixed cost: waiting longer for company
    than a batch of one would take to run saves nothing.
    """
    if fit is None and not measured:
        raise ValueError("nothing to advise from: no fit and no size measured")
    budget = _budget(target_s)
    rungs = ladder(largest)
    known = {b: m for b, m in (measured or {}).items() if m.enough and b in rungs}
    allowed = {b: m for b, m in known.items() if 2 * m.batch_seconds <= budget}
    if allowed:
        top = max(m.throughput for m in allowed.values())
        best = min(b for b, m in allowed.items() if m.throughput >= CLOSE_ENOUGH * top)
        others = ", ".join(f"{b}: {m.throughput:.1f}" for b, m in allowed.items() if b != best)
        why = (f"batches of {best} answered {allowed[best].throughput:.1f} req/s per worker, "
               + ("the most measured" if allowed[best].throughput == top
                  else f"within {1 - CLOSE_ENOUGH:.0%} of the most measured")
               + (f" ({others})" if others else ""))
        if known.keys() - allowed.keys():
            assert target_s is not None  # without a target every size is allowed
            why += (f"; larger batches take too long for {TARGET_SHARE:.0%} of the "
                    f"{target_s * 1e3:.0f} ms target")
        seconds = allowed[best].batch_seconds
        above = [b for b in rungs if b > best]
        if fit is not None and above and above[0] not in known:
            ahead = _advise_from_fit(fit, target_s, largest)
            if ahead.batch_size > best:  # the line expects more from larger, untried batches
                if fit.r2 >= MIN_R2:
                    return dataclasses.replace(ahead, why=f"{ahead.why}; measured up to {best}")
                why += (f"; the line, explaining {fit.r2:.0%} of the timings, is not followed "
                        "past the sizes measured")
    elif known and fit is None:  # every size measured passes the target: try smaller
        assert target_s is not None  # without a target every size is allowed
        smallest = min(known)
        best = max([1] + [b for b in rungs if b < smallest])
        seconds = known[smallest].batch_seconds * best / smallest
        why = (f"two batches of {smallest} ({2 * known[smallest].batch_seconds * 1e3:.1f} ms) "
               f"pass {TARGET_SHARE:.0%} of the {target_s * 1e3:.0f} ms target")
    elif fit is None:  # only sizes above the largest allowed now were measured
        return Advice(rungs[-1], None, f"no more than {largest} can be batched now")
    else:
        return _advise_from_fit(fit, target_s, largest)
    delay = None if fit is None else round(min(fit.fixed, max(0.0, budget - 2 * seconds)) * 1e3, 2)
    return Advice(best, delay, why)


def _advise_from_fit(fit: Fit, target_s: float | None, largest: int) -> Advice:
    c, m = fit.fixed, fit.per_item
    knee = math.ceil((SHARE_OF_CEILING / (1 - SHARE_OF_CEILING)) * c / m)
    best = max(b for b in ladder(largest) if b == 1 or b <= knee)
    why = (f"batches of {best} reach {fit.speedup(best) / fit.ceiling:.0%} of the most batching "
           f"gives ({fit.ceiling:.1f}x)")
    if best == largest and fit.speedup(best) < SHARE_OF_CEILING * fit.ceiling:
        why = f"the largest batch advised ({largest}) reaches {fit.speedup(best):.1f}x"
    delay = c
    if target_s is not None:
        budget = TARGET_SHARE * target_s
        fits = int((budget / 2 - c) // m) if budget / 2 > c else 0
        if fits < 1:
            return Advice(1, 0.0, f"two batches of one ({2 * fit.seconds(1) * 1e3:.1f} ms) "
                                  f"pass {TARGET_SHARE:.0%} of the {target_s * 1e3:.0f} ms "
                                  "target: it cannot be met under load")
        if fits < best:
            best = max(b for b in ladder(largest) if b == 1 or b <= fits)
            why = (f"the largest batch whose two batch times fit in {TARGET_SHARE:.0%} of the "
                   f"{target_s * 1e3:.0f} ms target ({fit.speedup(best):.1f}x of "
                   f"{fit.ceiling:.1f}x)")
        delay = min(c, max(0.0, budget - 2 * fit.seconds(best)))
    return Advice(best, round(delay * 1e3, 2), why)


def next_to_try(advice: Advice, fit: Fit | None, target_s: float | None, largest: int,
                measured: dict[int, Measured]) -> int | None:
    """The rung next to the advised size to run next, to measure it: the larger, else the
    smaller, when it has no measure in the window, the line does not already rule it out, and
    its batches would fit the target (as far as the fit, or the advised size's own measure, can
    tell). None: run the advice."""
    size = advice.batch_size
    here = measured.get(size)
    if here is None or not here.enough:
        return None  # the advice itself is not measured yet
    budget = _budget(target_s)
    rungs = ladder(largest)
    if size not in rungs:
        return None
    at = rungs.index(size)
    for other in rungs[at + 1:at + 2] + rungs[max(0, at - 1):at]:
        seen = measured.get(other)
        if seen is not None and seen.enough:
            continue
        if fit is not None and fit.throughput(other) < RULED_OUT * fit.throughput(size):
            continue  # a fixed cost large against the items': halving the batch cannot pay
        # unmeasured, and no fit: twice the batch takes at most twice as long (c >= 0)
        seconds = (fit.seconds(other) if fit is not None
                   else here.batch_seconds * max(1.0, other / size))
        if 2 * seconds <= budget:
            return other
    return None


def _budget(target_s: float | None) -> float:
    """Seconds that two batch times and the delay may take under a latency target."""
    return TARGET_SHARE * target_s if target_s is not None else math.inf


def curve(fit: Fit, sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> list[dict[str, float]]:
    """``S(B)``, a worker's throughput and the batch time at each of ``sizes``."""
    return [{"batchSize": b, "speedup": round(fit.speedup(b), 3),
             "throughput": round(fit.throughput(b), 2),
             "batchMs": round(fit.seconds(b) * 1e3, 3)} for b in sizes]
