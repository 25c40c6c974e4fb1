"""A stateful model (TorchServe's sequenceBatching) served end to end: a handler written as
TorchServe's stateful example keeps each sequence's running sum in its worker's memory, so a
sum that comes out right proves the sequence's requests ran in order on one worker.

The tests share one daemon, so each names its sequences afresh (``sequences.name``: a sum
left in a worker under an old name would be added to) and ends every one it opened when it is
done (``sequences`` ends them at teardown, pass or fail): a sequence left open takes a place of
maxNumSequence and of the client's max_sequences_per_client, and shows in openSequences, so
the next test, whichever it is, would be refused or miscount."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from conftest import wait_until

SEQ_ID = "ts_request_sequence_id"
SEQ_END = "ts_request_sequence_end"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon, write_archive

    write_archive(store, "stateful", "stateful_sum.py",
                  config={"sequenceBatching": True, "minWorkers": 2, "maxWorkers": 2,
                          "batchSize": 4, "maxBatchDelay": 10, "maxNumSequence": 4,
                          "maxSequenceJobQueueSize": 10, "sequenceMaxIdleMSec": 60000})
    write_archive(store, "statefulone", "stateful_sum.py",
                  config={"sequenceBatching": True, "minWorkers": 1, "maxWorkers": 1,
                          "batchSize": 1, "maxNumSequence": 1,
                          "sequenceMaxIdleMSec": 400})
    daemon = Daemon(tmp_path_factory.mktemp("stateful"), store,
                    {"load_models": "stateful.mar,statefulone.mar"})
    daemon.start()
    wait_until(lambda: [w["status"] for w in daemon.describe("stateful")[0]["workers"]]
               == ["READY", "READY"], 60, "both workers to be ready")  # sequences spread
    yield daemon
    daemon.stop()


class Sequences:
    """The sequences one test opens: fresh names for it, and each ended at its teardown."""

    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self.opened: list[tuple[str, str]] = []

    def name(self, model: str, prefix: str) -> str:
        """A sequence id no other test (or earlier run of this one) has used."""
        return self.track(model, f"{prefix}-{uuid.uuid4().hex[:8]}")

    def track(self, model: str, sequence: str) -> str:
        """Remember a sequence the server opened (and named) for this test, to end it."""
        self.opened.append((model, sequence))
        return sequence

    def end_all(self) -> None:
        # the last opened first: one idle since would be opened again by its end request,
        # and on statefulone (maxNumSequence 1) refused while a later one is still open
        for model, sequence in reversed(self.opened):
            add(self.daemon, model, 0, sequence, end=True)
        for model in {model for model, _ in self.opened}:
            wait_until(lambda model=model: open_sequences(self.daemon, model) == 0, 10,
                       f"the test's sequences of {model} to close",
                       details=self.daemon.logs)


@pytest.fixture
def sequences(daemon):
    opened = Sequences(daemon)
    yield opened
    opened.end_all()


def open_sequences(daemon, model: str) -> int:
    return daemon.describe(model)[0]["jobQueueStatus"]["openSequences"]


def add(daemon, model: str, n: int, sequence: str | None = None, sleep: float = 0.0,
        end: bool = False):
    headers = {}
    if sequence is not None:
        headers[SEQ_ID] = sequence
    if end:
        headers[SEQ_END] = "true"
    return daemon.predict(model, json={"add": n, "sleep": sleep}, headers=headers)


def test_each_sequence_runs_in_order_on_one_worker_and_the_sequences_share_both(
        daemon, sequences) -> None:
    def sequence(name: str) -> list[dict]:
        answers = []
        for n in range(1, 9):  # the last one ends it
            answer = add(daemon, "stateful", n, name, sleep=0.01, end=n == 8)
            assert answer.status_code == 200, answer.text
            assert answer.headers[SEQ_ID] == name
            answers.append(answer.json())
        return answers

    names = [sequences.name("stateful", f"seq-{i}") for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(names, pool.map(sequence, names)))
    for name, answers in results.items():
        assert [a["sum"] for a in answers] == [sum(range(1, n + 1)) for n in range(1, 9)]
        assert len({a["pid"] for a in answers}) == 1, f"{name} moved between workers"
        assert {a["sequence"] for a in answers} == {name}
        assert {a["start"] for a in answers} == {None}  # the client named it
    assert len({answers[0]["pid"] for answers in results.values()}) == 2


def test_requests_of_one_sequence_sent_at_once_run_one_at_a_time(daemon, sequences) -> None:
    together = sequences.name("stateful", "together")
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: add(daemon, "stateful", 1, together, sleep=0.05),
                                range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    # one at a time: each saw the sum the one before it left, never a batch-mate's
    assert sorted(a.json()["sum"] for a in answers) == [1, 2, 3, 4, 5, 6]
    assert {a.json()["batch"] for a in answers} == {1}
    assert add(daemon, "stateful", 1, together, end=True).json()["sum"] == 7


def test_a_request_naming_no_sequence_opens_one_and_is_told_its_id(daemon, sequences) -> None:
    first = add(daemon, "stateful", 5)
    assert first.status_code == 200, first.text
    sequence = sequences.track("stateful", first.headers[SEQ_ID])
    assert sequence.startswith("ts-seq-")
    assert first.json()["start"] == "true" and first.json()["sequence"] == sequence
    then = add(daemon, "stateful", 7, sequence, end=True)
    assert then.json()["sum"] == 12 and then.json()["start"] is None


def test_past_max_num_sequence_a_new_sequence_is_refused_503_until_one_idles_out(
        daemon, sequences) -> None:
    only = sequences.name("statefulone", "only")
    another = sequences.name("statefulone", "another")
    assert add(daemon, "statefulone", 1, only).status_code == 200
    refused = add(daemon, "statefulone", 1, another)
    assert refused.status_code == 503
    body = refused.json()
    assert body["code"] == 503 and body["type"] == "ServiceUnavailableException"
    assert "maxNumSequence" in body["message"]
    assert "Retry-After" not in refused.headers  # not overload: the open sequence goes on,
    going_on = add(daemon, "statefulone", 1, only)  # not held at the door a moment
    assert going_on.status_code == 200 and going_on.json()["sum"] == 2
    wait_until(lambda: open_sequences(daemon, "statefulone") == 0, 10,
               "the sequence to idle out (sequenceMaxIdleMSec is 400)", interval=0.05)
    answer = add(daemon, "statefulone", 3, another)
    assert answer.status_code == 200 and answer.json()["sum"] == 3


def test_the_request_marked_end_closes_its_sequence(daemon, sequences) -> None:
    short = sequences.name("statefulone", "short")
    following = sequences.name("statefulone", "next")
    assert add(daemon, "statefulone", 2, short, end=True).status_code == 200
    # at once: "short" has ended (statefulone's maxNumSequence is 1, its idle time 400 ms)
    answer = add(daemon, "statefulone", 4, following)
    assert answer.status_code == 200, answer.text


def test_describe_shows_a_stateful_models_settings_and_open_sequences(daemon, sequences) -> None:
    described_id = sequences.name("stateful", "described")
    assert add(daemon, "stateful", 1, described_id).status_code == 200
    [described] = daemon.describe("stateful")
    assert described["stateful"] is True and described["sequenceBatching"] is True
    assert (described["maxNumSequence"], described["maxSequenceJobQueueSize"],
            described["sequenceMaxIdleMSec"], described["sequenceTimeoutMSec"]) == (
        8, 10, 60000, 0)  # 4 set, but at least batchSize x maxWorkers, as in TorchServe
    assert described["jobQueueStatus"]["openSequences"] == 1
    from test_client_commands import mservd, ok

    text = ok(mservd("models", "describe", "stateful", daemon=daemon))
    assert ("  sequences:        1 open of 8, 10 queued each at most, closed idle 60000 ms"
            in text.splitlines()), text
    assert add(daemon, "stateful", 1, described_id, end=True).status_code == 200
    assert daemon.describe("stateful")[0]["jobQueueStatus"]["openSequences"] == 0


def test_torchserve_grpc_sequence_id_and_stream_predictions2(daemon, sequences) -> None:
    from mservd.frontends.grpc.generated import inference_pb2, inference_pb2_grpc

    channel = grpc.insecure_channel(daemon.grpc_address("inference"))
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    key = (("authorization", f"Bearer {daemon.key('inference')}"),)

    def request(n: int, sequence: str = "", model: str = "stateful"):
        return inference_pb2.PredictionsRequest(
            model_name=model, input={"data": json.dumps({"add": n}).encode()},
            sequence_id=sequence)

    named = sequences.name("stateful", "grpc-seq")
    answer = stub.Predictions(request(2, named), metadata=key, timeout=30)
    assert answer.sequence_id == named and json.loads(answer.prediction)["sum"] == 2
    answer = stub.Predictions(request(3, named), timeout=30,  # the end, as metadata
                              metadata=key + (("ts_request_sequence_end", "true"),))
    assert json.loads(answer.prediction)["sum"] == 5

    # one stream, one sequence: the first request names none, the server opens one
    requests = [request(1), request(2), request(3, model="nope"), request(4)]
    answers = list(stub.StreamPredictions2(iter(requests), metadata=key, timeout=60))
    assert len(answers) == 4
    opened = sequences.track("stateful", answers[0].sequence_id)
    assert opened.startswith("ts-seq-")
    assert [json.loads(a.prediction)["sum"] for a in (answers[0], answers[1], answers[3])] == [
        1, 3, 7]
    assert {a.sequence_id for a in answers} == {opened}
    assert answers[2].status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "nope" in answers[2].status.message

    # the end of a stream's sequence, per request: an input, as TorchServe reads it there
    before = daemon.describe("stateful")[0]["jobQueueStatus"]["openSequences"]
    last = request(5)
    last.input[SEQ_END] = b"true"
    answers = list(stub.StreamPredictions2(iter([request(1), last]), metadata=key, timeout=60))
    sequences.track("stateful", answers[0].sequence_id)
    assert [json.loads(a.prediction)["sum"] for a in answers] == [1, 6]
    assert daemon.describe("stateful")[0]["jobQueueStatus"]["openSequences"] == before
    channel.close()
