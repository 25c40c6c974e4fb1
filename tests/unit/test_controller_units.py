"""The controller's parts without processes or sockets: constructors do no I/O, so the
management verbs and the supervisor's pool decisions are tested on a controller never started."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mservd import protocol
from mservd.config import Settings, resolve_model_settings
from mservd.controller.loop import Controller
from mservd.core.registry import ModelVersion
from mservd.core.worker_handle import WorkerHandle, WorkerState
from mservd.errors import BadRequest, error_body
from mservd.protocol import Reply


class FakeChild:
    """A worker process that is alive until killed; records what it was sent."""

    def __init__(self) -> None:
        self.pid = 4242
        self.returncode: int | None = None
        self.signals: list[str] = []

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.signals.append("TERM")

    def kill(self) -> None:
        self.signals.append("KILL")
        self.returncode = -9


def controller(tmp_path: Path, **settings) -> Controller:
    ctl = Controller(Settings(snapshot=False, **settings), "ipc:///nowhere/f",
                     "ipc:///nowhere/b", tmp_path, keys=None, gpu_count=0)
    ctl.stopped_workers = []  # type: ignore[attr-defined]
    ctl.supervisor.send_stop = ctl.stopped_workers.append  # type: ignore[attr-defined]
    return ctl


def add_version(ctl: Controller, name: str, states: list[WorkerState], **api) -> ModelVersion:
    settings = resolve_model_settings(ctl.settings, name, "1.0", api=api or None)
    mv = ModelVersion(name=name, version="1.0", url=f"{name}.mar", model_dir=Path("/nowhere"),
                      manifest={"model": {"handler": "h.py"}}, settings=settings, model_yaml={})
    ctl.registry.add(mv)
    for i, state in enumerate(states):
        worker = WorkerHandle(f"{9000 + i}", name, "1.0", FakeChild(), None, mv=mv)
        worker.state = state
        mv.workers[worker.id] = worker
        ctl.supervisor.workers[worker.identity] = worker
    mv.target_workers = len(states)
    return mv


def call(ctl: Controller, op: str, **args):
    answers = []
    result = ctl.management.call(op, args, None, answers.append)
    return result if result is not None else answers[0]


def test_controller_constructor_binds_nothing_and_starts_no_process(tmp_path: Path) -> None:
    ctl = controller(tmp_path)
    assert ctl.front is None and ctl.back is None
    assert ctl.supervisor.zygote.proc is None
    ctl.close()


def test_management_describes_a_version_with_its_settings_and_workers(tmp_path: Path) -> None:
    ctl = controller(tmp_path)
    add_version(ctl, "m", [WorkerState.SERVING, WorkerState.STARTING], batch_size=4)
    [doc] = call(ctl, "describe", model="m").body
    assert (doc["modelName"], doc["batchSize"], doc["minWorkers"]) == ("m", 4, 2)
    assert [w["status"] for w in doc["workers"]] == ["READY", "STARTING"]
    assert doc["jobQueueStatus"] == {"remainingCapacity": 100, "pendingRequests": 0}


def test_management_lists_models_a_page_at_a_time(tmp_path: Path) -> None:
    ctl = controller(tmp_path)
    for name in ("a", "b", "c"):
        add_version(ctl, name, [])
    page = call(ctl, "list", limit="2").body
    assert [m["modelName"] for m in page["models"]] == ["a", "b"]
    assert page["nextPageToken"] == "2"
    with pytest.raises(BadRequest, match="integer"):
        call(ctl, "list", limit="two")


def test_management_scale_refuses_impossible_counts(tmp_path: Path) -> None:
    ctl = controller(tmp_path)
    add_version(ctl, "m", [])
    with pytest.raises(BadRequest, match="max_worker"):
        call(ctl, "scale", model="m", min_worker="3", max_worker="2")
    with pytest.raises(BadRequest, match="boolean"):
        call(ctl, "scale", model="m", min_worker="0", synchronous="maybe")


def test_scaling_down_stops_starting_then_idle_workers_before_busy_ones(tmp_path: Path) -> None:
    ctl = controller(tmp_path)
    mv = add_version(ctl, "m", [WorkerState.SERVING, WorkerState.SERVING, WorkerState.STARTING])
    busy, idle, starting = (mv.workers[i] for i in ("9000", "9001", "9002"))
    ctl.scheduler.running[busy.id] = object()  # type: ignore[assignment]
    mv.target_workers = 1
    ctl.reconcile_pools(now=0.0)
    assert starting.stop_requested and starting.proc.signals == ["TERM"]  # still loading
    assert idle.stop_requested and ctl.stopped_workers == [idle]  # told to stop at once
    assert not busy.stop_requested


def test_a_worker_that_does_not_load_in_time_is_killed_and_the_version_says_why(
        tmp_path: Path) -> None:
    ctl = controller(tmp_path)
    mv = add_version(ctl, "m", [WorkerState.STARTING], startup_timeout=5)
    [worker] = mv.workers.values()
    ctl.supervisor.time_out_starting(now=worker.spawned_at + 1)
    assert worker.proc.signals == []
    ctl.supervisor.time_out_starting(now=worker.spawned_at + 6)
    assert worker.proc.signals == ["KILL"]
    assert "startup_timeout (5 s)" in mv.load_error


def test_the_key_a_verb_needs_is_the_verbs_to_pick() -> None:
    from mservd import protocol
    from mservd.auth import INFERENCE, MANAGEMENT
    from mservd.controller.loop import key_for

    # a prediction's token is checked with the inference key, the dashboard's with management
    assert key_for("authorize", protocol.API_INFERENCE) == INFERENCE
    assert key_for("authorize", protocol.API_MANAGEMENT) == MANAGEMENT
    # claiming the inference API lends a management verb no weaker key
    assert key_for("unregister", protocol.API_INFERENCE) == MANAGEMENT
    assert key_for("overview", protocol.API_INFERENCE) == MANAGEMENT
    assert key_for("metrics", protocol.API_INFERENCE) is None


class SentFrames:
    """A ROUTER socket that records what it was given to send."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(frames)


def test_describe_customized_asks_a_worker_and_answers_with_what_the_handler_said(
        tmp_path: Path) -> None:
    ctl = controller(tmp_path)
    ctl.front, ctl.back = SentFrames(), SentFrames()
    add_version(ctl, "m", [WorkerState.SERVING])
    answers: list[Reply] = []
    said = [(protocol.head(200), b'{"labels": 10}'),  # a dict, as JSON
            (protocol.head(200, "text/plain"), b'{"labels": 3}'),  # json.dumps of one
            (protocol.head(507), error_body(507, "WorkerOOM", "out of memory"))]
    for head, body in said:
        assert ctl.management.call("describe", {"model": "m", "customized": "true"}, None,
                                   answers.append) is None
        [identity, kind, *frames] = ctl.back.sent.pop()
        [question] = protocol.parse_batch(frames)
        assert kind == protocol.BATCH and question.payloads == []
        assert question.kind == protocol.DESCRIPTION and question.headers == {}
        assert question.handler_headers() == {"describe": "True"}
        ctl.on_worker([identity, *protocol.done([protocol.Result(question.rid, head, body)])],
                      time.monotonic())
        ctl.send_answers()
    described, from_text, failed = answers
    assert described.status == 200 and described.body[0]["customizedMetadata"] == {"labels": 10}
    assert from_text.body[0]["customizedMetadata"] == {"labels": 3}
    assert failed.status == 507 and json.loads(failed.body)["type"] == "WorkerOOM"
    assert ctl.front.sent == [] and ctl.questions == {}  # nothing went to a frontend


def test_a_request_that_breaks_the_scheduler_is_answered_500_and_its_message_mates_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctl = controller(tmp_path)
    ctl.front, ctl.back = SentFrames(), SentFrames()
    add_version(ctl, "m", [WorkerState.SERVING], batch_size=2)
    enqueue = ctl.scheduler.enqueue

    def breaks_on_b(fid, route, parts, now):
        if route.rid == b"b":
            raise OverflowError("cannot convert float infinity to integer")
        return enqueue(fid, route, parts, now)

    monkeypatch.setattr(ctl.scheduler, "enqueue", breaks_on_b)
    message = protocol.predictions(
        protocol.prediction(rid, "m", None, None, protocol.CODEC_TORCHSERVE, [], {}, [])
        for rid in (b"a", b"b", b"c"))
    ctl.on_frontend([b"frontend-1", *message], time.monotonic())
    [(_, _, *batch)] = ctl.back.sent
    assert [r.rid for r in protocol.parse_batch(batch)] == [b"a", b"c"]
    ctl.send_answers()
    [(fid, _, *replies)] = ctl.front.sent
    [refused] = protocol.parse_results(replies)
    assert fid == b"frontend-1" and refused.rid == b"b"
    assert protocol.Head.parse(refused.head).status == 500
    assert b"OverflowError" in refused.body
