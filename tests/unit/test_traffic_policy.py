"""Versions that share traffic (core/traffic.py): the policy a client sends, the split by draw
and by sticky key, exclusion, and the breaker; then the scheduler routing with it, shadow copies
and the lease rule, with a fake clock and fixed draws."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from test_scheduler import FRONTEND, ok, route

from mservd import protocol
from mservd.config import Settings, resolve_model_settings
from mservd.core.leases import LONE_BATCHES, Lend
from mservd.core.metrics import Metrics
from mservd.core.registry import ModelVersion, Registry
from mservd.core.scheduler import SHADOW, Refuse, Scheduler, SendBatch
from mservd.core.traffic import Health, Traffic, TrafficPolicy, key_point, pick
from mservd.core.worker_handle import WorkerHandle, WorkerState
from mservd.errors import BadRequest, Forbidden

VERSIONS = ["1.0", "2.0", "3.0"]


def parse(doc, stateful: bool = False) -> TrafficPolicy:
    return TrafficPolicy.parse("m", doc, VERSIONS, stateful)


# -- the policy document ------------------------------------------------------------------------


def test_a_policy_of_versions_alone_is_their_weights() -> None:
    policy = parse({"1.0": 90, "2.0": 10})
    assert policy.weights == {"1.0": 90, "2.0": 10} and not policy.sticky and not policy.shadow
    assert policy.summary() == "1.0 90 %, 2.0 10 %"


def test_the_full_document_round_trips() -> None:
    doc = {"weights": {"1.0": 3, "2.0": 1}, "sticky": True, "shadow": {"3.0": 25},
           "maxErrorRate": {"2.0": 0.2}}
    policy = parse(doc)
    assert policy.document() == doc
    assert parse(policy.document()) == policy
    assert policy.summary() == "1.0 75 %, 2.0 25 %"


@pytest.mark.parametrize(("doc", "wording"), [
    ({"1.0": 90, "4.0": 10},
     "Field \"weights\": model m has no version '4.0'. Available: '1.0', '2.0', '3.0'."),
    ({"1.0": -1}, 'Field "weights": version 1.0 must be a number at least 0, got -1.'),
    ({"1.0": "ninety"}, "must be a number at least 0, got 'ninety'."),
    ({"1.0": 0, "2.0": 0}, 'Field "weights" must add up to more than 0.'),
    ({"weights": {"1.0": 1}, "shadow": {"1.0": 10}},
     'Field "shadow": version 1.0 of model m also has a weight'),
    ({"weights": {"1.0": 1}, "shadow": {"2.0": 120}},
     'Field "shadow": version 2.0 must be a number from 0 to 100, got 120.'),
    ({"weights": {"1.0": 1}, "maxErrorRate": {"1.0": 2}},
     'Field "maxErrorRate": version 1.0 must be a number from 0 to 1'),
    ({"weights": {"1.0": 1}, "sticky": "yes"}, 'Field "sticky" must be true or false'),
    ({"weights": {"1.0": 1}, "mirror": {}}, "Unknown traffic field 'mirror'."),
    ([90, 10], "must be a JSON object"),
    ({"1.0": float("inf")}, 'version 1.0 must be a number at least 0, got inf.'),
])
def test_a_bad_policy_is_refused_naming_its_field(doc, wording: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse(doc)
    assert wording in caught.value.message


def test_a_stateful_model_may_not_shadow() -> None:
    with pytest.raises(BadRequest, match="stateful"):
        parse({"weights": {"1.0": 1}, "shadow": {"2.0": 10}}, stateful=True)


# -- picking a version --------------------------------------------------------------------------


def test_a_draw_falls_in_its_versions_share_of_the_cumulative_weights() -> None:
    weights = {"1.0": 90, "2.0": 10}
    every = lambda v: True
    assert pick(weights, VERSIONS, every, 0.0) == "1.0"
    assert pick(weights, VERSIONS, every, 0.8999) == "1.0"
    assert pick(weights, VERSIONS, every, 0.9) == "2.0"
    assert pick(weights, VERSIONS, every, 0.9999999) == "2.0"


def test_an_excluded_version_loses_its_share_to_the_others_and_none_left_is_none() -> None:
    weights = {"1.0": 50, "2.0": 50}
    assert pick(weights, VERSIONS, lambda v: v != "2.0", 0.99) == "1.0"
    assert pick(weights, VERSIONS, lambda v: False, 0.5) is None


def test_a_sticky_key_always_sees_one_version_and_a_ramp_moves_only_the_keys_between() -> None:
    traffic = Traffic(30, 20, 30, draw=itertools.cycle([0.1, 0.95]).__next__)
    before = TrafficPolicy({"1.0": 90, "2.0": 10}, sticky=True)
    after = TrafficPolicy({"1.0": 80, "2.0": 20}, sticky=True)
    keys = [f"user-{i}" for i in range(2000)]
    first = {k: traffic.choose(before, VERSIONS, lambda v: True, k) for k in keys}
    again = {k: traffic.choose(before, VERSIONS, lambda v: True, k) for k in keys}
    assert first == again
    ramped = {k: traffic.choose(after, VERSIONS, lambda v: True, k) for k in keys}
    moved = [k for k in keys if first[k] != ramped[k]]
    assert all(first[k] == "1.0" and ramped[k] == "2.0" for k in moved)
    assert all(0.8 <= key_point(k) < 0.9 for k in moved)
    assert 130 < len(moved) < 270  # about a tenth of the keys: [0.8, 0.9)


def test_without_sticky_or_without_a_key_each_request_draws() -> None:
    draws = iter([0.1, 0.95, 0.95])
    traffic = Traffic(30, 20, 30, draw=draws.__next__)
    weights = {"1.0": 90, "2.0": 10}
    assert traffic.choose(TrafficPolicy(weights), VERSIONS, lambda v: True, "k") == "1.0"
    assert traffic.choose(TrafficPolicy(weights), VERSIONS, lambda v: True, "k") == "2.0"
    assert traffic.choose(TrafficPolicy(weights, sticky=True), VERSIONS, lambda v: True,
                          None) == "2.0"


# -- the breaker --------------------------------------------------------------------------------


def test_a_version_past_its_error_rate_trips_then_is_half_open_after_its_cooldown() -> None:
    health = Health(window_s=10, min_requests=20, cooldown_s=5)
    assert not health.sample(0.0, 0, 0, 0.2)
    assert not health.sample(1.0, 10, 10, 0.2)  # too few answers to judge
    assert health.sample(2.0, 30, 20, 0.2)  # 20 of 30 failed
    assert health.open(2.0) and health.open(6.9) and health.state(3.0) == "tripped"
    assert not health.sample(3.0, 30, 20, 0.2)  # no answers while tripped ...
    assert health.rate == 20 / 30  # ... and it still shows the rate that tripped it
    assert not health.open(7.0)
    assert not health.sample(7.0, 30, 20, 0.2)
    assert health.state(7.0) == "half-open"


def test_a_half_open_version_that_fails_again_waits_twice_as_long_up_to_ten_times() -> None:
    health = Health(window_s=10, min_requests=2, cooldown_s=1)
    now, total, errors, waits = 0.0, 0, 0, []
    health.sample(now, total, errors, 0.5)
    for _ in range(6):
        total, errors = total + 4, errors + 4
        now += 0.1
        assert health.sample(now, total, errors, 0.5)
        assert health.tripped_until is not None
        waits.append(round(health.tripped_until - now, 6))
        now = health.tripped_until
        health.sample(now, total, errors, 0.5)  # half-open
    assert waits == [1, 2, 4, 8, 10, 10]


def test_a_half_open_version_healthy_for_a_window_is_closed_and_its_cooldown_reset() -> None:
    health = Health(window_s=10, min_requests=2, cooldown_s=1)
    health.sample(0.0, 0, 0, 0.5)
    assert health.sample(0.1, 4, 4, 0.5)
    health.sample(1.1, 4, 4, 0.5)
    assert health.state(1.2) == "half-open"
    health.sample(11.2, 100, 4, 0.5)
    assert health.state(11.2) == "closed" and health.factor == 1


def test_a_version_without_a_bound_never_trips() -> None:
    health = Health(window_s=10, min_requests=1, cooldown_s=1)
    health.sample(0.0, 0, 0, None)
    assert not health.sample(1.0, 100, 100, None)


# -- the scheduler under a policy ---------------------------------------------------------------


def registry_of(*versions: str, workers: int = 1, model_yaml: dict | None = None
                ) -> tuple[Registry, dict[str, ModelVersion]]:
    registry, out = Registry(), {}
    settings = Settings()
    for version in versions:
        model = resolve_model_settings(settings, "m", version, model_yaml=model_yaml)
        mv = ModelVersion(name="m", version=version, url="m.mar", model_dir=Path("/nowhere"),
                          manifest={}, settings=model, model_yaml=model_yaml or {})
        registry.add(mv)
        for i in range(workers):
            worker = WorkerHandle(f"{version}-{i}", "m", version, proc=None, gpu_id=None, mv=mv)
            worker.state = WorkerState.SERVING
            mv.workers[worker.id] = worker
        out[version] = mv
    return registry, out


def split(policy: TrafficPolicy, draws: list[float], *versions: str
          ) -> tuple[Scheduler, dict[str, ModelVersion]]:
    registry, mvs = registry_of(*(versions or ("1.0", "2.0")))
    registry.set_traffic("m", policy)
    s = Scheduler(Settings(), registry, Metrics())
    s.traffic.draw = iter(draws).__next__
    return s, mvs


def sent_to(actions) -> list[tuple[str, bytes, bytes]]:
    return [(a.worker.version, a.requests[0].fid, a.requests[0].rid) for a in actions
            if isinstance(a, SendBatch)]


def test_unversioned_requests_go_where_the_draw_falls_and_versioned_ones_where_they_say() -> None:
    s, _ = split(TrafficPolicy({"1.0": 90, "2.0": 10}), [0.95, 0.1])
    assert sent_to(s.submit(FRONTEND, route(b"a", 1.0), [], 1.0)) == [("2.0", FRONTEND, b"a")]
    assert sent_to(s.submit(FRONTEND, route(b"b", 1.0), [], 1.0)) == [("1.0", FRONTEND, b"b")]
    explicit = protocol.Route(b"c", "m", "2.0", None, sent=1.0)  # no draw left: none taken
    s.finished(next(iter(s.running.values())).mv.workers["2.0-0"], [ok(b"a")], 1.0)
    assert sent_to(s.submit(FRONTEND, explicit, [], 1.0)) == [("2.0", FRONTEND, b"c")]


def test_the_requests_of_one_group_meet_one_version_and_groups_share_as_weighted() -> None:
    """The choices of one OpenAI request (one group) reach one version, sticky or not; a
    sticky policy still follows the client's own key."""
    weights = {"1.0": 50, "2.0": 50}
    s, _ = split(TrafficPolicy(weights), [])  # no draw is taken for a group
    groups = [f"g{i}" for i in range(400)]
    seen = {}
    for group in groups:
        key = protocol.group_key(group, None)
        versions = {s.pick_version(protocol.Route(b"r", "m", None, None, key=key), s.registry
                                   .traffic("m"), 1.0) for _ in range(4)}
        assert len(versions) == 1, group
        seen[group] = versions.pop()
    assert 150 < sum(v == "2.0" for v in seen.values()) < 250  # Binomial(400, .5): 5 sigma
    sticky, _ = split(TrafficPolicy(weights, sticky=True), [])
    for group in groups[:50]:
        route = protocol.Route(b"r", "m", None, None, key=protocol.group_key(group, "user-7"))
        assert sticky.pick_version(route, sticky.registry.traffic("m"), 1.0) == \
            sticky.traffic.choose(TrafficPolicy(weights, sticky=True), ["1.0", "2.0"],
                                  lambda v: True, "user-7")


def test_a_group_key_carries_the_clients_key_and_a_plain_key_is_no_group() -> None:
    assert protocol.split_key(protocol.group_key("g", "user-7")) == ("g", "user-7")
    assert protocol.split_key(protocol.group_key("g", None)) == ("g", None)
    assert protocol.split_key("user-7") == (None, "user-7")
    assert protocol.split_key(None) == (None, None)


def test_a_version_without_a_live_worker_gets_no_traffic_and_causes_no_refusal() -> None:
    s, mvs = split(TrafficPolicy({"1.0": 50, "2.0": 50}), [0.99] * 3)
    for worker in mvs["2.0"].workers.values():
        worker.state = WorkerState.STOPPING
    actions = s.submit(FRONTEND, route(b"a", 1.0), [], 1.0)
    assert sent_to(actions) == [("1.0", FRONTEND, b"a")]
    assert s.metrics.traffic_excluded.labels("m", "2.0", "no_worker")._value.get() == 1


def test_a_tripped_version_gets_no_traffic_until_its_cooldown_passes() -> None:
    s, _ = split(TrafficPolicy({"1.0": 50, "2.0": 50}, max_error_rate={"2.0": 0.5}),
                 [0.99] * 3)
    s.traffic.health_of(("m", "2.0")).tripped_until = 5.0
    assert sent_to(s.submit(FRONTEND, route(b"a", 1.0), [], 1.0)) == [("1.0", FRONTEND, b"a")]
    assert sent_to(s.submit(FRONTEND, route(b"b", 6.0), [], 6.0)) == [("2.0", FRONTEND, b"b")]


def test_with_every_weighted_version_out_the_default_version_answers_as_without_a_policy(
) -> None:
    s, mvs = split(TrafficPolicy({"2.0": 1}), [0.5])
    for worker in mvs["2.0"].workers.values():
        worker.state = WorkerState.STOPPING
    assert sent_to(s.submit(FRONTEND, route(b"a", 1.0), [], 1.0)) == [("1.0", FRONTEND, b"a")]


def test_a_shadow_copy_goes_to_the_shadow_version_with_the_same_frames() -> None:
    s, _ = split(TrafficPolicy({"1.0": 1}, shadow={"2.0": 50}), [0.3, 0.2], "1.0", "2.0")
    frames = [b"meta", b"payload"]
    actions = s.submit(FRONTEND, route(b"a", 1.0), frames, 1.0)
    assert sorted(sent_to(actions)) == [("1.0", FRONTEND, b"a"), ("2.0", SHADOW, b"a~s2.0")]
    copy = next(a for a in actions if isinstance(a, SendBatch) and a.worker.version == "2.0")
    assert copy.requests[0].frames[1] is frames[1]
    assert s.shadows == {b"a~s2.0": ("m", "2.0")}


def test_a_shadow_copy_refused_leaves_the_caller_alone_and_is_counted_dropped() -> None:
    s, mvs = split(TrafficPolicy({"1.0": 1}, shadow={"2.0": 100}), [0.3, 0.2], "1.0", "2.0")
    for worker in mvs["2.0"].workers.values():
        worker.state = WorkerState.STOPPING
    actions = s.submit(FRONTEND, route(b"a", 1.0), [], 1.0)
    assert sent_to(actions) == [("1.0", FRONTEND, b"a")]
    assert not [a for a in actions if isinstance(a, Refuse)]
    assert s.metrics.shadow_requests.labels("m", "2.0", "dropped")._value.get() == 1


def test_a_stateful_sequence_stays_on_the_version_that_opened_it() -> None:
    registry, _ = registry_of("1.0", "2.0", model_yaml={"sequenceBatching": True,
                                                        "sequenceMaxIdleMSec": 60000})
    registry.set_traffic("m", TrafficPolicy({"1.0": 50, "2.0": 50}))
    s = Scheduler(Settings(), registry, Metrics())
    s.traffic.draw = iter([0.9]).__next__  # the first request opens its sequence on 2.0
    [send] = [a for a in s.submit(FRONTEND, route(b"a", 1.0), [], 1.0)
              if isinstance(a, SendBatch)]
    sequence = send.requests[0].sequence
    assert send.worker.version == "2.0" and sequence
    s.traffic.draw = lambda: 0.1  # a draw would say 1.0 now
    assert s.pick_version(route(b"b", 2.0, sequence=sequence), s.registry.traffic("m"),
                          2.0) == "2.0"


def test_no_lease_takes_unversioned_requests_while_versions_share_traffic() -> None:
    registry, mvs = registry_of("1.0")
    s = Scheduler(Settings(), registry, Metrics())
    s.leases.enabled, s.leases.reply_prefix = True, b"ipc://r"
    worker = mvs["1.0"].workers["1.0-0"]
    worker.job_endpoint = "ipc://jobs"
    s.leases.lone[mvs["1.0"].key] = LONE_BATCHES
    [lend] = s.leases.lend(mvs["1.0"], worker, b"ipc://r-1", {}, 1.0)
    assert isinstance(lend, Lend) and lend.lease.default
    s.leases.holders.clear()
    registry.set_traffic("m", TrafficPolicy({"1.0": 1}))
    [lend] = s.leases.lend(mvs["1.0"], worker, b"ipc://r-1", {}, 2.0)
    assert not lend.lease.default


def test_a_version_named_by_a_policy_cannot_be_unregistered() -> None:
    registry, _ = registry_of("1.0", "2.0")
    registry.set_traffic("m", TrafficPolicy({"1.0": 90, "2.0": 10}))
    with pytest.raises(Forbidden, match="its traffic policy names it"):
        registry.remove("m", "2.0")


def test_review_trips_a_version_past_its_bound_once_and_counts_the_trip() -> None:
    s, _ = split(TrafficPolicy({"1.0": 50, "2.0": 50}, max_error_rate={"2.0": 0.5}), [])
    answers = s.metrics.version(("m", "2.0")).answers
    assert s.review_traffic(0.0) == []
    answers.update({200: 5, 500: 4})
    assert s.review_traffic(1.0) == []  # 9 answers: fewer than traffic_min_requests (20)
    answers.update({200: 5, 500: 20})
    assert s.review_traffic(2.0) == [("m", "2.0", 0.8)]
    assert s.traffic.tripped(("m", "2.0"), 2.5)
    assert s.review_traffic(2.5) == []  # tripped once
    assert s.metrics.traffic_trips.labels("m", "2.0")._value.get() == 1
