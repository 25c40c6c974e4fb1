"""The batching advisor: what one batch of a model version costs, and the batch it should run.

A batch of ``B`` requests takes ``t(B) = c + m·B`` seconds: ``c`` paid once per batch (the hop
to the worker and back, the handler's fixed work, a kernel launch) and ``m`` per request. The
controller fits ``c`` and ``m`` to each version's recent batch timings by least squares
(:class:`BatchCosts`); from the fit follow the speed-up of batching ``S(B) = B(c+m)/(c+Bm)``, its
ceiling ``1 + c/m``, a worker's throughput ``B/(c+Bm)``, and the batch size and delay that
serve the model best within its latency target (:func:`advise`). With ``batchSize: auto`` or a
latency target (``maxLatencyMs``) the scheduler applies the advice as it goes.

Pure arithmetic: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW = 256  # recent batches the fit is made from
MIN_SAMPLES = 16  # fewer batches than this: no fit yet
LARGEST_BATCH = 64  # the most the advisor recommends
SHARE_OF_CEILING = 0.9  # a batch worth running reaches this share of S's ceiling
TARGET_SHARE = 0.8  # of a latency target, what two batch times and the delay may use


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


class BatchCosts:
    """The recent batch timings of one version, and the line through them."""

    def __init__(self, window: int = WINDOW) -> None:
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)
        self._fit: Fit | None = None
        self._stale = False

    def add(self, size: int, seconds: float) -> None:
        if size > 0 and seconds >= 0:
            self.samples.append((size, seconds))
            self._stale = True

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
    max_batch_delay_ms: float
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"batchSize": self.batch_size, "maxBatchDelay": self.max_batch_delay_ms,
                "why": self.why}


def advise(fit: Fit, target_s: float | None = None, largest: int = LARGEST_BATCH) -> Advice:
    """The batch size and delay that serve ``fit``'s model best.

    The batch is the smallest that reaches 90 % of the speed-up's ceiling (``B ≥ 9c/m``):
    larger ones add latency for little. Under a latency target a request may wait for the batch
    in progress, then run in its own, so two batch times and the delay must fit in 80 % of the
    target. The delay is at most one fixed cost: waiting longer for company than a batch of one
    would take to run saves nothing.
    """
    c, m = fit.fixed, fit.per_item
    best = max(1, min(largest, math.ceil((SHARE_OF_CEILING / (1 - SHARE_OF_CEILING)) * c / m)))
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
            best = fits
            why = (f"the largest batch whose two batch times fit in {TARGET_SHARE:.0%} of the "
                   f"{target_s * 1e3:.0f} ms target ({fit.speedup(best):.1f}x of "
                   f"{fit.ceiling:.1f}x)")
        delay = min(c, max(0.0, budget - 2 * fit.seconds(best)))
    return Advice(best, round(delay * 1e3, 2), why)


def curve(fit: Fit, sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> list[dict[str, float]]:
    """``S(B)``, a worker's throughput and the batch time at each of ``sizes``."""
    return [{"batchSize": b, "speedup": round(fit.speedup(b), 3),
             "throughput": round(fit.throughput(b), 2),
             "batchMs": round(fit.seconds(b) * 1e3, 3)} for b in sizes]
