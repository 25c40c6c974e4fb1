"""Versions that share a model's traffic, on a real daemon (issue 49): a weighted split within
binomial bounds and labelled by the version that served, sticky keys, the management API's
wording, snapshots and the models= keys, shadow copies that never touch the caller, and
fallback from a failing or workerless canary."""

from __future__ import annotations

import collections
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from conftest import wait_until, write_archive

MODEL = "split"


@pytest.fixture(scope="module")
def split_store(store: Path) -> Path:
    """The versioned fixture as model ``split`` 1.0 and 2.0 (fast), 3.0 (each batch sleeps
    2 s) and 4.0 (each batch fails), and ``canary`` 1.0 and 2.0 (2.0 fails while a file
    exists); batches of up to 8 so 16 clients keep two cores busy."""
    fast = {"batchSize": 8, "maxBatchDelay": 5}
    write_archive(store, MODEL, "versioned.py", version="1.0", config=fast)
    write_archive(store, MODEL, "versioned.py", version="2.0", config=fast)
    write_archive(store, MODEL, "versioned.py", version="3.0", config={**fast, "sleep_s": 2})
    write_archive(store, MODEL, "versioned.py", version="4.0", config={**fast, "fail": True})
    return store


def split_daemon(daemon_factory, versions=("1.0", "2.0"), **properties):
    archives = ",".join(f"{MODEL}.mar" if v == "1.0" else f"{MODEL}-{v}.mar" for v in versions)
    return daemon_factory({"load_models": archives, **properties})


def versions_seen(daemon, count: int, clients: int = 16, headers=None) -> collections.Counter:
    """``count`` unversioned predictions from ``clients`` threads: the versions that answered
    (every answer must be a 200)."""
    def one(_: int) -> str:
        answer = daemon.predict(MODEL, data=b"1", headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()["version"]

    with ThreadPoolExecutor(clients) as pool:
        return collections.Counter(pool.map(one, range(count)))


def requests_counted(daemon, version: str) -> float:
    return daemon.metrics().get(
        f'ts_inference_requests_total{{model_name="{MODEL}",model_version="{version}"}}', 0.0)


def put_traffic(daemon, document) -> requests.Response:
    return daemon.manage("PUT", f"/models/{MODEL}/traffic", json=document)


def test_a_90_10_split_lands_within_binomial_bounds_and_each_version_counts_what_it_served(
        daemon_factory, split_store) -> None:
    daemon = split_daemon(daemon_factory)
    answer = put_traffic(daemon, {"1.0": 90, "2.0": 10})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": 'Traffic of model "split" set: 1.0 90 %, 2.0 10 %'}
    before = {v: requests_counted(daemon, v) for v in ("1.0", "2.0")}
    seen = versions_seen(daemon, 2000)
    # 2.0's count is Binomial(2000, 0.1): mean 200, sigma 13.4; +-4.5 sigma
    assert 140 <= seen["2.0"] <= 260, seen
    assert seen["1.0"] + seen["2.0"] == 2000
    for version in ("1.0", "2.0"):
        assert requests_counted(daemon, version) - before[version] == seen[version]
    doc = daemon.manage("GET", f"/models/{MODEL}/traffic").json()
    assert doc["policy"] is True and doc["weights"] == {"1.0": 90, "2.0": 10}
    assert [(v["modelVersion"], v["share"], v["state"]) for v in doc["versions"]] == [
        ("1.0", 90, "serving"), ("2.0", 10, "serving")]
    assert daemon.metrics()[
        f'mservd_traffic_weight{{model_name="{MODEL}",model_version="2.0"}}'] == 10
    # a request that names its version is never re-routed
    assert {daemon.predict(MODEL, "2.0", data=b"1").json()["version"] for _ in range(20)} == {
        "2.0"}
    answer = daemon.manage("DELETE", f"/models/{MODEL}/traffic")
    assert answer.status_code == 200, answer.text
    assert versions_seen(daemon, 50, clients=4) == {"1.0": 50}


BAD_DOCUMENTS = [
    ({"1.0": 90, "9.0": 10}, "Field \"weights\": model split has no version '9.0'."),
    ({"1.0": -5}, 'Field "weights": version 1.0 must be a number at least 0, got -5.'),
    ({"1.0": 0}, 'Field "weights" must add up to more than 0.'),
    ({"weights": {"1.0": 1}, "shadow": {"1.0": 5}}, "either served or shadowed"),
    ({"weights": {"1.0": 1}, "canary": 1}, "Unknown traffic field 'canary'."),
    ("90/10", "must be a JSON object"),
]


def test_a_bad_traffic_document_is_a_400_naming_its_field_and_changes_nothing(
        daemon_factory, split_store) -> None:
    daemon = split_daemon(daemon_factory)
    for document, wording in BAD_DOCUMENTS:
        answer = put_traffic(daemon, document)
        assert answer.status_code == 400, (document, answer.text)
        body = answer.json()
        assert (body["code"], body["type"]) == (400, "BadRequestException")
        assert wording in body["message"], (document, body)
    answer = daemon.manage("PUT", f"/models/{MODEL}/traffic", data=b"{not json")
    assert answer.status_code == 400 and "is not JSON" in answer.json()["message"]
    answer = daemon.manage("PUT", "/models/nosuch/traffic", json={"1.0": 1})
    assert answer.status_code == 404 and answer.json()["message"] == "Model not found: nosuch"
    assert daemon.manage("GET", f"/models/{MODEL}/traffic").json()["policy"] is False
    assert daemon.predict(MODEL, data=b"1").status_code == 200


def test_one_sticky_key_always_sees_one_version(daemon_factory, split_store) -> None:
    daemon = split_daemon(daemon_factory)
    assert put_traffic(daemon, {"weights": {"1.0": 50, "2.0": 50}, "sticky": True}
                       ).status_code == 200
    keys = [f"user-{i}" for i in range(50)]

    def versions_of(key: str) -> set[str]:
        return {daemon.predict(MODEL, data=b"1", headers={"X-Traffic-Key": key}).json()[
            "version"] for _ in range(5)}

    with ThreadPoolExecutor(8) as pool:
        seen = dict(zip(keys, pool.map(versions_of, keys), strict=True))
    assert all(len(versions) == 1 for versions in seen.values()), seen
    by_version = collections.Counter(next(iter(v)) for v in seen.values())
    assert by_version["1.0"] > 5 and by_version["2.0"] > 5, by_version  # both get keys


def test_a_policy_survives_a_restart_and_the_models_block_sets_one_at_start(
        daemon_factory, split_store, tmp_path) -> None:
    models = '{"split": {"1.0": {"trafficWeight": 3}, "2.0": {"trafficWeight": 1}}}'
    daemon = split_daemon(daemon_factory, models=models, enable_model_api="true")
    doc = daemon.manage("GET", f"/models/{MODEL}/traffic").json()
    assert doc["policy"] is True and doc["weights"] == {"1.0": 3, "2.0": 1}
    assert put_traffic(daemon, {"weights": {"1.0": 1, "2.0": 4}, "sticky": True,
                                "maxErrorRate": {"2.0": 0.5}}).status_code == 200
    daemon.stop()
    daemon.start()  # the snapshot's policy wins over the models= block's
    doc = daemon.manage("GET", f"/models/{MODEL}/traffic").json()
    assert (doc["weights"], doc["sticky"], doc["maxErrorRate"]) == (
        {"1.0": 1, "2.0": 4}, True, {"2.0": 0.5})
    assert daemon.manage("DELETE", f"/models/{MODEL}/2.0").status_code == 403


def test_the_cli_sets_shows_and_clears_a_policy(daemon_factory, split_store) -> None:
    from test_client_commands import mservd, ok

    daemon = split_daemon(daemon_factory)
    out = ok(mservd("models", "traffic", MODEL, "1.0=3", "2.0=1", "--sticky",
                    "--max-error-rate", "2.0=0.5", daemon=daemon))
    assert out.strip() == 'Traffic of model "split" set: 1.0 75 %, 2.0 25 %'
    shown = ok(mservd("models", "traffic", MODEL, daemon=daemon))
    assert "split: sticky policy" in shown
    assert [line.split()[:4] for line in shown.splitlines()[2:]] == [
        ["1.0", "75.0", "-", "serving"], ["2.0", "25.0", "-", "serving"]]
    bad = mservd("models", "traffic", MODEL, "1.0=3", "5.0=1", daemon=daemon)
    assert bad.returncode != 0 and "no version '5.0'" in bad.stderr
    assert "removed" in ok(mservd("models", "traffic", MODEL, "--clear", daemon=daemon))


def test_grpc_sets_traffic_and_a_key_in_metadata_sticks_as_the_http_header_does(
        daemon_factory, split_store) -> None:
    import grpc

    from mservd.frontends.grpc.generated import (
        inference_pb2,
        inference_pb2_grpc,
        mservd_management_pb2,
        mservd_management_pb2_grpc,
    )

    daemon = split_daemon(daemon_factory)
    inference = grpc.insecure_channel(daemon.grpc_address("inference"))
    management = grpc.insecure_channel(daemon.grpc_address("management"))
    traffic = mservd_management_pb2_grpc.TrafficAPIsStub(management)
    predictions = inference_pb2_grpc.InferenceAPIsServiceStub(inference)
    ikey = ("authorization", f"Bearer {daemon.key('inference')}")
    mkey = (("authorization", f"Bearer {daemon.key('management')}"),)

    answer = traffic.SetTraffic(mservd_management_pb2.SetTrafficRequest(
        model_name=MODEL, traffic_json='{"weights": {"1.0": 1, "2.0": 1}, "sticky": true}'),
        metadata=mkey, timeout=30)
    assert json.loads(answer.msg) == {"status": 'Traffic of model "split" set: 1.0 50 %, '
                                                '2.0 50 %'}
    described = json.loads(traffic.DescribeTraffic(mservd_management_pb2.DescribeTrafficRequest(
        model_name=MODEL), metadata=mkey, timeout=30).msg)
    assert described["sticky"] is True and described["weights"] == {"1.0": 1, "2.0": 1}
    for bad, wording in (("{", "is not JSON"), ('{"7.0": 1}', "no version '7.0'")):
        with pytest.raises(grpc.RpcError) as err:
            traffic.SetTraffic(mservd_management_pb2.SetTrafficRequest(
                model_name=MODEL, traffic_json=bad), metadata=mkey, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert wording in err.value.details()

    def over_grpc(key: str) -> str:
        answer = predictions.Predictions(inference_pb2.PredictionsRequest(
            model_name=MODEL, input={"data": b"1"}), metadata=(ikey, ("x-traffic-key", key)),
            timeout=30)
        return json.loads(answer.prediction)["version"]

    seen = {}
    for i in range(30):
        key = f"grpc-user-{i}"
        versions = {over_grpc(key) for _ in range(3)}
        assert len(versions) == 1, (key, versions)
        over_http = daemon.predict(MODEL, data=b"1", headers={"x-traffic-key": key})
        assert over_http.json()["version"] in versions  # one key, one version, any protocol
        seen[key] = versions.pop()
    assert set(seen.values()) == {"1.0", "2.0"}
    answer = traffic.ClearTraffic(mservd_management_pb2.ClearTrafficRequest(model_name=MODEL),
                                  metadata=mkey, timeout=30)
    assert "removed" in json.loads(answer.msg)["status"]


def caller_latencies(daemon, count: int) -> list[float]:
    """``count`` unversioned predictions one after another: each one's seconds (all 200s
    from version 1.0)."""
    out = []
    for _ in range(count):
        started = time.perf_counter()
        answer = daemon.predict(MODEL, data=b"1")
        out.append(time.perf_counter() - started)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"version": "1.0"}
    return out


def shadow_count(daemon, version: str, outcome: str) -> float:
    return daemon.metrics().get(
        f'mservd_shadow_requests_total{{model_name="{MODEL}",model_version="{version}",'
        f'outcome="{outcome}"}}', 0.0)


def test_a_shadow_that_sleeps_or_fails_changes_nothing_for_the_caller_and_is_counted(
        daemon_factory, split_store) -> None:
    daemon = split_daemon(daemon_factory, versions=("1.0", "3.0", "4.0"),
                          lend_idle_workers="false")  # both runs through the controller
    caller_latencies(daemon, 10)  # warm
    alone = statistics.median(caller_latencies(daemon, 40))
    assert put_traffic(daemon, {"weights": {"1.0": 1}, "shadow": {"3.0": 100, "4.0": 100}}
                       ).status_code == 200
    shadowed = statistics.median(caller_latencies(daemon, 40))
    # 3.0 sleeps 2 s a batch and 4.0 fails every one: had either touched the caller, its
    # median would be seconds or its answers errors. 5 ms: two shared cores' noise
    assert shadowed <= 2 * alone + 0.005, (alone, shadowed)
    for version in ("3.0", "4.0"):
        copies = shadow_count(daemon, version, "sent") + shadow_count(daemon, version,
                                                                      "dropped")
        assert copies == 40, (version, copies)
    sent = shadow_count(daemon, "4.0", "sent")
    wait_until(lambda: shadow_count(daemon, "4.0", "error") == sent, 30,
               "the failing shadow's answers to be counted")
    wait_until(lambda: shadow_count(daemon, "3.0", "ok") >= 8, 30,
               "the sleeping shadow's first batch to be counted")
    assert shadow_count(daemon, "4.0", "ok") == 0
    served = daemon.metrics()[
        f'ts_inference_requests_total{{model_name="{MODEL}",model_version="4.0"}}']
    assert served == sent  # a copy counts as a request of the version that served it
    assert daemon.describe(MODEL, "3.0")[0]["traffic"]["state"] == "shadow"


@pytest.fixture(scope="module")
def canary_flag(store: Path) -> Path:
    """Model ``canary``: 1.0 always answers, 2.0 fails while the returned file exists."""
    flag = store / ".canary-fails"
    fast = {"batchSize": 8, "maxBatchDelay": 5}
    write_archive(store, "canary", "versioned.py", version="1.0", config=fast)
    write_archive(store, "canary", "versioned.py", version="2.0",
                  config={**fast, "fail_while": str(flag)})
    return flag


def canary_answers(daemon, count: int) -> collections.Counter:
    """``count`` unversioned predictions of ``canary`` from 8 clients: (version or status)."""
    def one(_: int) -> str:
        answer = daemon.predict("canary", data=b"1")
        return answer.json()["version"] if answer.status_code == 200 else str(
            answer.status_code)

    with ThreadPoolExecutor(8) as pool:
        return collections.Counter(pool.map(one, range(count)))


def canary_state(daemon) -> str:
    return daemon.describe("canary", "2.0")[0]["traffic"]["state"]


def test_a_failing_canary_loses_its_traffic_and_regains_it_after_its_cooldown(
        daemon_factory, canary_flag) -> None:
    daemon = daemon_factory({"load_models": "canary.mar,canary-2.0.mar",
                             "traffic_cooldown_s": 8, "traffic_min_requests": 10,
                             "traffic_error_window_s": 10})
    assert daemon.manage("PUT", "/models/canary/traffic", json={
        "weights": {"1.0": 50, "2.0": 50}, "maxErrorRate": {"2.0": 0.5}}).status_code == 200
    canary_flag.touch()
    try:
        def tripped() -> bool:
            canary_answers(daemon, 20)  # half of them 500s from the canary, until it trips
            return canary_state(daemon).startswith("tripped until ")

        wait_until(tripped, 30, "the failing canary to trip")
        # within the 8 s cooldown: every request to the stable version, none refused
        assert canary_answers(daemon, 200) == {"1.0": 200}
        doc = daemon.manage("GET", "/models/canary/traffic").json()
        canary = doc["versions"][1]
        assert canary["errorRate"] > 0.5 and canary["maxErrorRate"] == 0.5
        assert daemon.metrics()[
            'mservd_traffic_trips_total{model_name="canary",model_version="2.0"}'] == 1
        assert "traffic of model canary version 2.0 tripped" in daemon.logs()
        events = daemon.manage("GET", "/dashboard/overview").json()["events"]
        assert any(e["kind"] == "traffic tripped" and e["version"] == "2.0" for e in events)
    finally:
        canary_flag.unlink(missing_ok=True)
    wait_until(lambda: not canary_state(daemon).startswith("tripped"), 20,
               "the canary's cooldown to pass")
    assert canary_state(daemon) in ("half-open", "serving")
    back = canary_answers(daemon, 100)
    assert set(back) == {"1.0", "2.0"} and back["2.0"] > 20, back  # its share, Binomial(100, .5)


def test_a_canary_without_workers_gets_no_traffic_and_causes_no_503(
        daemon_factory, split_store) -> None:
    daemon = split_daemon(daemon_factory)
    answer = daemon.session.post(daemon.url("management", "/dashboard/actions/traffic"), json={
        "model": MODEL, "traffic": {"weights": {"1.0": 50, "2.0": 50}}},
        headers=daemon._headers("management", None), timeout=30)
    assert answer.status_code == 200, answer.text  # the dashboard's action
    answer = daemon.manage("PUT", f"/models/{MODEL}/2.0",
                           params={"min_worker": 0, "max_worker": 0, "synchronous": "true"})
    assert answer.status_code == 200, answer.text
    assert versions_seen(daemon, 100, clients=8) == {"1.0": 100}
    overview = daemon.manage("GET", "/dashboard/overview").json()
    shares = {m["version"]: m["traffic"] for m in overview["models"] if m["name"] == MODEL}
    assert shares["2.0"]["state"] == "no live worker" and shares["2.0"]["share"] == 50
    assert shares["1.0"]["state"] == "serving"
    assert daemon.metrics()['mservd_traffic_excluded_total{model_name="split",'
                            'model_version="2.0",reason="no_worker"}'] > 0
    answer = daemon.manage("PUT", f"/models/{MODEL}/2.0",
                           params={"min_worker": 1, "synchronous": "true"})
    assert answer.status_code == 200, answer.text
    assert set(versions_seen(daemon, 100, clients=8)) == {"1.0", "2.0"}
