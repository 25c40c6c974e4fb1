"""Versions that share a model's traffic: weights, a sticky key, shadow copies, and fallback.

A model with a :class:`TrafficPolicy` (``PUT /models/{m}/traffic``) has its unversioned
requests routed among its versions by weight, in the scheduler (so every protocol's are); a
request that names its version is never re-routed. With ``sticky`` a request's key (the
``traffic_key_header`` header, gRPC metadata of the same name) hashes to one point of [0, 1),
laid over the versions' cumulative weights in version order: one key always sees one version,
and ramping 90/10 to 80/20 moves only the keys in [0.8, 0.9). A version is left out while it
has no live worker or while its breaker (:class:`Health`) is open; the others share its weight,
and when none is left the default version serves as it would without a policy.

Pure: no clock and no randomness of its own (callers pass ``now`` and ``draw``), no I/O.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mservd.errors import BadRequest

DOCUMENT_KEYS = ("weights", "sticky", "shadow", "maxErrorRate")
MAX_COOLDOWN_FACTOR = 10  # a breaker that trips again waits twice as long, up to this many times


@dataclass(frozen=True)
class TrafficPolicy:
    """How one model's unversioned requests are shared: weights per version, whether a key
    sticks to a version, the share (percent) copied to shadow versions, and per-version bounds
    on the 5xx rate past which a version loses its traffic for a while."""

    weights: Mapping[str, float]
    sticky: bool = False
    shadow: Mapping[str, float] = field(default_factory=dict)
    max_error_rate: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, model: str, doc: Any, versions: Iterable[str],
              stateful: bool = False) -> TrafficPolicy:
        """The policy a client sent: ``{"1.0": 90, "2.0": 10}`` (weights alone) or the full
        document (:data:`DOCUMENT_KEYS`). Raises BadRequest naming the bad field."""
        known = list(versions)
        if not isinstance(doc, dict) or not doc:
            raise BadRequest(f"The traffic of model {model} must be a JSON object: "
                             '{"1.0": 90, "2.0": 10}, or {"weights": {...}, "sticky": true, '
                             '"shadow": {...}, "maxErrorRate": {...}}.')
        if not any(key in DOCUMENT_KEYS for key in doc):
            doc = {"weights": doc}
        unknown = [key for key in doc if key not in DOCUMENT_KEYS]
        if unknown:
            raise BadRequest(f"Unknown traffic field {unknown[0]!r}. Fields: "
                             f"{', '.join(DOCUMENT_KEYS)}.")
        weights = _per_version(model, "weights", doc.get("weights"), known, 0.0, math.inf)
        if not weights:
            raise BadRequest('Field "weights" must name at least one version with its weight.')
        if sum(weights.values()) <= 0:
            raise BadRequest('Field "weights" must add up to more than 0.')
        shadow = _per_version(model, "shadow", doc.get("shadow") or {}, known, 0.0, 100.0)
        both = sorted(v for v in shadow if weights.get(v, 0) > 0)
        if both:
            raise BadRequest(f'Field "shadow": version {both[0]} of model {model} also has a '
                             "weight; a version is either served or shadowed.")
        if shadow and stateful:
            raise BadRequest(f'Field "shadow": model {model} is stateful (sequenceBatching); '
                             "a copy would open sequences its clients never continue.")
        rates = _per_version(model, "maxErrorRate", doc.get("maxErrorRate") or {}, known,
                             0.0, 1.0)
        sticky = doc.get("sticky", False)
        if not isinstance(sticky, bool):
            raise BadRequest(f'Field "sticky" must be true or false, got {sticky!r}.')
        return cls(weights, sticky, {v: p for v, p in shadow.items() if p > 0}, rates)

    def document(self) -> dict[str, Any]:
        """The policy as the full document: what GET shows and a snapshot keeps."""
        return {"weights": dict(self.weights), "sticky": self.sticky,
                "shadow": dict(self.shadow), "maxErrorRate": dict(self.max_error_rate)}

    def summary(self) -> str:
        """``1.0 90 %, 2.0 10 %``: each weight as a share of the total."""
        total = sum(self.weights.values())
        return ", ".join(f"{v} {_number(w * 100.0 / total)} %" for v, w in self.weights.items())

    def versions(self) -> set[str]:
        """Every version this policy names: weighted, shadowed or bounded."""
        return {*self.weights, *self.shadow, *self.max_error_rate}


def _per_version(model: str, name: str, value: Any, known: list[str], low: float,
                 high: float) -> dict[str, float]:
    """A field that maps versions to numbers within [low, high]."""
    if not isinstance(value, dict):
        raise BadRequest(f'Field "{name}" must be an object of versions to numbers, got '
                         f"{type(value).__name__}.")
    out: dict[str, float] = {}
    for version, number in value.items():
        if version not in known:
            raise BadRequest(f'Field "{name}": model {model} has no version {version!r}. '
                             f"Available: {', '.join(repr(v) for v in known)}.")
        if (isinstance(number, bool) or not isinstance(number, (int, float))
                or not math.isfinite(number) or not low <= number <= high):
            bound = "at least 0" if high == math.inf else f"from {_number(low)} to {_number(high)}"
            raise BadRequest(f'Field "{name}": version {version} must be a number {bound}, got '
                             f"{number!r}.")
        out[version] = float(number)
    return out


def _number(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


def key_point(key: str) -> float:
    """Where a sticky key falls in [0, 1): a hash, so the same key always falls there."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def pick(weights: Mapping[str, float], order: list[str], eligible: Callable[[str], bool],
         point: float) -> str | None:
    """The version whose share of the cumulative weights (in ``order``, eligible versions
    only, renormalised) holds ``point`` in [0, 1); None when no version is eligible."""
    chosen = [(v, weights[v]) for v in order if weights.get(v, 0) > 0 and eligible(v)]
    total = sum(w for _, w in chosen)
    if not chosen or total <= 0:
        return None
    edge = 0.0
    for version, weight in chosen:
        edge += weight / total
        if point < edge:
            return version
    return chosen[-1][0]  # point within rounding of 1.0


class Health:
    """A version's 5xx breaker: its answers sampled as (time, total, 5xx) over a window; past
    ``max_error_rate`` with at least ``min_requests`` answers in it, it *trips* (no traffic)
    for a cooldown, then is *half-open*: it has its weight back, and failing again trips it
    with the cooldown doubled (up to MAX_COOLDOWN_FACTOR times), while a whole window without
    a trip closes it."""

    def __init__(self, window_s: float, min_requests: int, cooldown_s: float) -> None:
        self.window_s = window_s
        self.min_requests = min_requests
        self.cooldown_s = cooldown_s
        self.samples: deque[tuple[float, int, int]] = deque()
        self.tripped_until: float | None = None
        self.half_open_since: float | None = None
        self.factor = 1
        self.rate = 0.0  # the 5xx rate over the window, as last sampled

    def state(self, now: float) -> str:
        if self.tripped_until is not None and now < self.tripped_until:
            return "tripped"
        return "half-open" if self.half_open_since is not None else "closed"

    def open(self, now: float) -> bool:
        """Whether the version gets no traffic now."""
        return self.tripped_until is not None and now < self.tripped_until

    def sample(self, now: float, total: int, errors: int, bound: float | None) -> bool:
        """Record the version's answer counts so far; True when this sample trips it."""
        if self.tripped_until is not None and now >= self.tripped_until:
            self.tripped_until = None  # the cooldown passed: half-open, counted afresh
            self.half_open_since = now
            self.samples.clear()
        self.samples.append((now, total, errors))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()
        _, total0, errors0 = self.samples[0]
        answered, failed = total - total0, errors - errors0
        if answered > 0:
            self.rate = failed / answered
        elif not self.open(now):
            self.rate = 0.0  # (a tripped version gets no answers: it shows the rate that tripped it)
        if self.half_open_since is not None and now - self.half_open_since >= self.window_s:
            self.half_open_since = None  # a whole window without a trip: closed again
            self.factor = 1
        if (bound is None or self.open(now) or answered < self.min_requests
                or self.rate <= bound):
            return False
        if self.half_open_since is not None:
            self.factor = min(self.factor * 2, MAX_COOLDOWN_FACTOR)
        self.tripped_until = now + self.cooldown_s * self.factor
        self.half_open_since = None
        self.samples.clear()
        self.samples.append((now, total, errors))
        return True


def version_state(version: str, live: int, policy: TrafficPolicy, health: Health | None,
                  now: float) -> dict[str, Any]:
    """One version under ``policy``, as describe, GET /models/{m}/traffic and the dashboard
    show it: weight and share, shadow percent, error bound and rate, and its state (serving,
    shadow, unweighted, no live worker, tripped until <UTC time>, half-open). ``live``: its
    serving workers."""
    total = sum(policy.weights.values()) or 1.0
    weight = policy.weights.get(version, 0.0)
    if version in policy.shadow:
        state = "shadow"
    elif weight <= 0:
        state = "unweighted"
    elif live == 0:
        state = "no live worker"
    elif health is not None and health.tripped_until is not None and health.open(now):
        until = time.time() + health.tripped_until - now
        state = time.strftime("tripped until %Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
    else:
        state = "half-open" if health is not None and health.state(now) == "half-open" \
            else "serving"
    out: dict[str, Any] = {"weight": weight, "share": round(weight * 100.0 / total, 3),
                           "state": state, "liveWorkers": live}
    if version in policy.shadow:
        out["shadowPercent"] = policy.shadow[version]
    if version in policy.max_error_rate:
        out["maxErrorRate"] = policy.max_error_rate[version]
        out["errorRate"] = round(health.rate, 4) if health is not None else 0.0
    return out


class Traffic:
    """The breakers of the versions under a policy, and the draws that route requests: what
    the scheduler asks for each unversioned request of a model with a policy."""

    def __init__(self, window_s: float, min_requests: int, cooldown_s: float,
                 draw: Callable[[], float]) -> None:
        self.window_s = window_s
        self.min_requests = min_requests
        self.cooldown_s = cooldown_s
        self.draw = draw  # uniform in [0, 1): random.random, fixed in tests
        self.health: dict[tuple[str, str], Health] = {}

    def health_of(self, key: tuple[str, str]) -> Health:
        health = self.health.get(key)
        if health is None:
            health = self.health[key] = Health(self.window_s, self.min_requests,
                                               self.cooldown_s)
        return health

    def tripped(self, key: tuple[str, str], now: float) -> bool:
        health = self.health.get(key)
        return health is not None and health.open(now)

    def choose(self, policy: TrafficPolicy, order: list[str], eligible: Callable[[str], bool],
               key: str | None, group: str | None = None) -> str | None:
        """The version of one request: by its key's point when the policy is sticky and the
        request has a key, else by its group's point (requests that must meet one version: a
        fresh id hashes as a draw would fall), else by a fresh draw (None: no version
        eligible)."""
        if policy.sticky and key:
            point = key_point(key)
        else:
            point = key_point(group) if group else self.draw()
        return pick(policy.weights, order, eligible, point)

    def shadows(self, policy: TrafficPolicy) -> list[str]:
        """The shadow versions that get a copy of this request (each its own draw)."""
        return [v for v, percent in policy.shadow.items() if self.draw() * 100.0 < percent]

    def review(self, name: str, policy: TrafficPolicy,
               answers: Mapping[str, Mapping[int, int]], now: float) -> list[str]:
        """Sample the answers of each bounded version (``answers``: its counts by status so
        far); the versions that trip now."""
        tripped = []
        for version, bound in policy.max_error_rate.items():
            counts = answers.get(version, {})
            total = sum(counts.values())
            errors = sum(n for status, n in counts.items() if status >= 500)
            if self.health_of((name, version)).sample(now, total, errors, bound):
                tripped.append(version)
        return tripped

    def forget(self, name: str) -> None:
        """A model's policy went: its breakers start afresh under the next one."""
        for key in [k for k in self.health if k[0] == name]:
            del self.health[key]
