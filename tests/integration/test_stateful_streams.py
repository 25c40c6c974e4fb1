"""A stateful streaming model (TorchServe's SequenceContinuousBatching: ``sequenceBatching`` and
``continuousBatching`` together) served end to end. The handler is written the way TorchServe's
example is (``tests/fixtures/handlers/stateful_stream.py``): a sequence's sum lives in its
worker's memory, streams run a few steps, ``-1`` cancels the sequence's running stream and
``0`` ends the sequence through the answer's ``ts_request_sequence_end`` header."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

SEQ_ID = "ts_request_sequence_id"
SEQ_END = "ts_request_sequence_end"
MODEL = "statefulstream"
STEPS = 6  # a stream's steps, 0.1 s each: the handler's STEPS


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon, wait_until, write_archive

    write_archive(store, MODEL, "stateful_stream.py",
                  config={"sequenceBatching": True, "continuousBatching": True,
                          "minWorkers": 2, "maxWorkers": 2, "batchSize": 4,
                          "maxNumSequence": 4, "maxSequenceJobQueueSize": 10,
                          "sequenceMaxIdleMSec": 60000})
    daemon = Daemon(tmp_path_factory.mktemp("statefulstream"), store,
                    {"load_models": f"{MODEL}.mar"})
    daemon.start()
    wait_until(lambda: [w["status"] for w in daemon.describe(MODEL)[0]["workers"]]
               == ["READY", "READY"], 60, "both workers to be ready")  # sequences spread
    yield daemon
    daemon.stop()


def send(daemon, n: int, sequence: str):
    return daemon.predict(MODEL, data=str(n), headers={SEQ_ID: sequence,
                                                       "Content-Type": "text/plain"})


def lines(answer) -> list[dict]:
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines() if line.strip()]


def open_sequences(daemon) -> int:
    return daemon.describe(MODEL)[0]["jobQueueStatus"]["openSequences"]


def test_a_stateful_streaming_model_is_applied_not_warned_away(daemon) -> None:
    [described] = daemon.describe(MODEL)
    assert described["sequenceBatching"] is True and described["continuousBatching"] is True


def test_each_sequence_streams_on_one_worker_and_its_state_carries_on(daemon) -> None:
    def sequence(name: str) -> list[list[dict]]:
        answers = [send(daemon, n, name) for n in (1, 2, 3)]
        assert {a.headers[SEQ_ID] for a in answers} == {name}
        return [lines(a) for a in answers]

    names = [f"stream-{i}" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(names, pool.map(sequence, names)))
    pids = {}
    for name, (first, second, third) in results.items():
        assert [(line["sum"], line["step"]) for line in first] == [
            (1, s) for s in range(1, STEPS + 1)]
        assert [(line["sum"], line["step"]) for line in second] == [(3, 1)]  # not streamed
        assert [line["sum"] for line in third] == [6] * STEPS
        pids[name] = {line["pid"] for answer in (first, second, third) for line in answer}
        assert len(pids[name]) == 1, f"{name} moved between workers"
        assert send(daemon, 0, name).status_code == 200  # ends it
    assert len(set().union(*pids.values())) == 2  # the sequences shared both workers
    # they streamed side by side: some step ran more than one request
    assert any(line["running"] > 1 for answers in results.values()
               for answer in answers for line in answer)


def test_a_cancel_joins_its_sequence_while_a_stream_runs_and_ends_that_stream(daemon) -> None:
    with ThreadPoolExecutor(1) as pool:
        streaming = pool.submit(send, daemon, 5, "cancelled")
        time.sleep(0.15)  # the stream is in its second step
        cancel = send(daemon, -1, "cancelled")
        assert cancel.status_code == 200, cancel.text
        assert lines(cancel)[0]["sum"] == 5
        stream = lines(streaming.result(timeout=30))
    assert 1 <= len(stream) < STEPS and stream[-1]["step"] < STEPS, stream
    # the sequence goes on after the cancel
    assert [line["sum"] for line in lines(send(daemon, 2, "cancelled"))] == [7]
    send(daemon, 0, "cancelled")


def test_the_handler_ends_a_sequence_in_its_answers_headers(daemon) -> None:
    before = open_sequences(daemon)
    assert lines(send(daemon, 4, "ending"))[0]["sum"] == 4
    assert open_sequences(daemon) == before + 1
    ended = send(daemon, 0, "ending")
    assert ended.status_code == 200 and ended.headers[SEQ_END] == "ending"
    assert open_sequences(daemon) == before  # closed by the handler's word, not idled out
    # named again, it opens anew: the handler's state for it went with the end
    assert lines(send(daemon, 2, "ending"))[0]["sum"] == 2
    send(daemon, 0, "ending")


def test_grpc_stream_predictions2_streams_parts_and_lets_a_cancel_join(daemon) -> None:
    import grpc

    from mservd.frontends.grpc.generated import inference_pb2, inference_pb2_grpc

    channel = grpc.insecure_channel(daemon.grpc_address("inference"))
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    key = (("authorization", f"Bearer {daemon.key('inference')}"),)

    def request(n: int):
        return inference_pb2.PredictionsRequest(model_name=MODEL, input={"data": str(n).encode()},
                                                sequence_id="grpc-stream")

    # 3 streams; the cancel goes once its first part is back, and joins it
    answers = list(stub.StreamPredictions2(iter([request(3), request(-1), request(0)]),
                                           metadata=key, timeout=60))
    assert {a.sequence_id for a in answers} == {"grpc-stream"}
    got = [json.loads(a.prediction) for a in answers]
    steps = [line["step"] for line in got]
    assert {line["sum"] for line in got} == {3} and steps[0] == 1
    # step 1 three times (the stream's first part, the cancel's and the end's answers), and
    # the stream's later steps, cut short by the cancel
    assert steps.count(1) == 3 and max(steps) < STEPS and len(got) == max(steps) + 2, got
    channel.close()


def test_grpc_stream_predictions2_says_when_a_stream_fails_after_it_began(daemon) -> None:
    import grpc

    from mservd.frontends.grpc.generated import inference_pb2, inference_pb2_grpc

    channel = grpc.insecure_channel(daemon.grpc_address("inference"))
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    metadata = (("authorization", f"Bearer {daemon.key('inference')}"),
                ("x-request-timeout-ms", "250"))  # the stream takes 0.6 s
    stream = inference_pb2.PredictionsRequest(model_name=MODEL, input={"data": b"1"},
                                              sequence_id="grpc-late")
    answers = list(stub.StreamPredictions2(iter([stream]), metadata=metadata, timeout=60))
    assert answers[0].status.code == 0 and json.loads(answers[0].prediction)["step"] == 1
    last = answers[-1]
    assert last.status.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], answers
    assert last.sequence_id == "grpc-late" and not last.prediction
    assert "deadline" in last.status.message
    channel.close()
