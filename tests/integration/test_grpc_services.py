"""The gRPC frontend: v2 GRPCInferenceService with the real tritonclient.grpc, and TorchServe's
InferenceAPIsService / ManagementAPIsService with stubs generated from TorchServe's protos."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest

tritongrpc = pytest.importorskip("tritonclient.grpc")
from conftest import wait_until
from test_v2_http import tiny_input, v2_archives
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    v2_archives(store)
    daemon = Daemon(tmp_path_factory.mktemp("grpc"), store,
                    {"load_models": "tiny.mar,v2typed.mar,v2typed-2.0.mar"},
                    args=("--enable-model-api",))
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon):
    client = tritongrpc.InferenceServerClient(daemon.grpc_address("inference"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def auth(daemon):
    return {"authorization": f"Bearer {daemon.key('inference')}"}


def test_grpc_v2_health_and_metadata(client, auth) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "mservd" and "binary_tensor_data" in meta.extensions
    assert client.is_model_ready("tiny", headers=dict(auth))
    assert client.is_model_ready("v2typed", "2.0", headers=dict(auth))
    model = client.get_model_metadata("v2typed", "2.0", headers=dict(auth), as_json=True)
    assert model["name"] == "v2typed" and sorted(model["versions"]) == ["1.0", "2.0"]
    assert [i["name"] for i in model["inputs"]] == ["NUMBERS", "WORDS"]
    assert [o["datatype"] for o in model["outputs"]] == ["INT64", "BYTES", "INT64"]


def test_grpc_v2_infer_fp32_matches_predictions(daemon, client, auth) -> None:
    values = tiny_input(5)
    expected = daemon.predict("tiny", json=values).json()
    x = tritongrpc.InferInput("INPUT0", [1, 64], "FP32")
    x.set_data_from_numpy(np.array([values], dtype=np.float32))
    result = client.infer("tiny", [x], headers=dict(auth))
    np.testing.assert_array_equal(result.as_numpy("output0")[0],
                                  np.array(expected, dtype=np.float32))


def test_grpc_v2_infer_int64_and_bytes_match_predictions(daemon, client, auth) -> None:
    numbers, words = [5, -1, 2**35], ["grpc", "ünï"]
    expected = daemon.predict("v2typed", json={"NUMBERS": numbers, "WORDS": words}).json()
    a = tritongrpc.InferInput("NUMBERS", [3], "INT64")
    a.set_data_from_numpy(np.array(numbers, dtype=np.int64))
    b = tritongrpc.InferInput("WORDS", [2], "BYTES")
    b.set_data_from_numpy(np.array([w.encode() for w in words], dtype=object))
    outputs = [tritongrpc.InferRequestedOutput("DOUBLED"), tritongrpc.InferRequestedOutput("SHOUTED")]
    result = client.infer("v2typed", [a, b], outputs=outputs, headers=dict(auth),
                          model_version="2.0", request_id="r-1")
    assert result.as_numpy("DOUBLED").tolist() == expected["DOUBLED"]
    assert [w.decode() for w in result.as_numpy("SHOUTED")] == expected["SHOUTED"]
    response = result.get_response()
    assert response.model_version == "2.0" and response.id == "r-1"


def test_grpc_v2_concurrent_requests_are_batched(daemon, client, auth) -> None:
    def send(i: int, word: str, done: list):
        a = tritongrpc.InferInput("NUMBERS", [1], "INT64")
        a.set_data_from_numpy(np.array([i], dtype=np.int64))
        b = tritongrpc.InferInput("WORDS", [1], "BYTES")
        b.set_data_from_numpy(np.array([word.encode()], dtype=object))
        client.async_infer("v2typed", [a, b], lambda result, error: done.append((i, result, error)),
                           headers=dict(auth))

    done: list = []
    mark = daemon.log_end("model_v2typed.log")
    send(-1, "slow", done)  # keeps the only worker busy while the others queue
    daemon.wait_for_log("model_v2typed.log", "v2typed sleeping", since=mark)
    for i in range(12):
        send(i, f"g{i}", done)
    wait_until(lambda: len(done) >= 13, 60, "13 answers", details=daemon.logs)
    assert len(done) == 13 and all(e is None for _, _, e in done), [e for *_, e in done if e]
    by_id = {i: r for i, r, _ in done}
    for i in range(12):
        assert by_id[i].as_numpy("DOUBLED").tolist() == [2 * i]
        assert by_id[i].as_numpy("SHOUTED").tolist() == [f"G{i}".encode()]
    assert max(int(by_id[i].as_numpy("BATCH")[0]) for i in range(12)) > 1


def test_grpc_v2_errors_map_to_status_codes(client, auth) -> None:
    x = tritongrpc.InferInput("INPUT0", [1, 64], "FP32")
    x.set_data_from_numpy(np.zeros((1, 64), dtype=np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("nope", [x], headers=dict(auth))
    assert err.value.status() == "StatusCode.NOT_FOUND"
    assert "Model not found: nope" in err.value.message()
    wrong = tritongrpc.InferInput("NUMBERS", [1], "FP32")
    wrong.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    words = tritongrpc.InferInput("WORDS", [1], "BYTES")
    words.set_data_from_numpy(np.array([b"a"], dtype=object))
    with pytest.raises(InferenceServerException) as err:
        client.infer("v2typed", [wrong, words], headers=dict(auth))
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "the model expects INT64" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("tiny", [x], headers={"authorization": "Bearer wrong"})
    assert err.value.status() == "StatusCode.UNAUTHENTICATED"
    assert client.infer("tiny", [x], headers=dict(auth)).as_numpy("output0").shape == (1, 10)


def test_grpc_v2_an_input_in_both_contents_and_raw_input_contents_is_invalid_argument(
        daemon, auth) -> None:
    from tritonclient.grpc import service_pb2 as pb  # tritonclient's own, as a user's
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(daemon.grpc_address("inference"))
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    request = pb.ModelInferRequest(model_name="tiny")
    item = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    item.contents.fp32_contents.extend([0.5] * 64)
    request.raw_input_contents.append(np.zeros(64, dtype=np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request, metadata=list(auth.items()), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "has contents and raw_input_contents" in err.value.details()
    item.ClearField("contents")
    answer = stub.ModelInfer(request, metadata=list(auth.items()), timeout=30)
    assert answer.outputs[0].shape == [1, 10]
    channel.close()


def test_a_call_that_is_no_protobuf_is_invalid_argument_with_one_log_line_and_no_traceback(
        daemon) -> None:
    inference = grpc.insecure_channel(daemon.grpc_address("inference"))
    management = grpc.insecure_channel(daemon.grpc_address("management"))
    raw = {"request_serializer": lambda raw: raw, "response_deserializer": lambda raw: raw}
    ikey = (("authorization", f"Bearer {daemon.key('inference')}"),)
    mkey = (("authorization", f"Bearer {daemon.key('management')}"),)
    calls = [(inference.unary_unary("/inference.GRPCInferenceService/ServerLive", **raw), ()),
             (inference.unary_unary("/org.pytorch.serve.grpc.inference.InferenceAPIsService/"
                                    "Predictions", **raw), ikey),
             (management.unary_unary("/org.pytorch.serve.grpc.management.ManagementAPIsService/"
                                     "ListModels", **raw), mkey)]
    stream = inference.unary_stream("/org.pytorch.serve.grpc.inference.InferenceAPIsService/"
                                    "StreamPredictions", **raw)
    mark = daemon.log_end("grpc.log")
    for call, key in calls:  # a stranger's to a method without a token, a client's with one
        with pytest.raises(grpc.RpcError) as err:
            call(b"\xff\x01", metadata=key, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no protobuf message" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:  # a stranger's is refused before it is read
        calls[1][0](b"\xff\x01", timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as err:
        list(stream(b"\xff\x01", metadata=ikey, timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    daemon.wait_for_log("grpc.log", "StreamPredictions call that is no protobuf", since=mark)
    both_ways = inference.stream_stream("/org.pytorch.serve.grpc.inference."
                                        "InferenceAPIsService/StreamPredictions2", **raw)
    with pytest.raises(grpc.RpcError) as err:  # a stranger's stream: refused unread
        list(both_ways(iter([b"\xff\x01"]), timeout=30))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as err:
        list(both_ways(iter([b"\xff\x01"]), metadata=ikey, timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    daemon.wait_for_log("grpc.log", "StreamPredictions2 call that is no protobuf", since=mark)
    written = daemon.read_log("grpc.log", mark)
    assert written.count("that is no protobuf message") == 5
    assert "Traceback" not in written and " ERROR " not in written
    assert inference.unary_unary("/inference.GRPCInferenceService/ServerLive", **raw)(
        b"", timeout=30) == b"\x08\x01"  # ServerLiveResponse(live=True): still served
    inference.close()
    management.close()


def test_a_flood_of_calls_that_are_no_protobuf_logs_ten_lines_per_ten_seconds(
        daemon_factory) -> None:
    """A stranger cannot bury grpc.log: the lines are capped, and the cap says what it held.

    The cap counts lines of one template per 10 s window in the gRPC frontend, whichever test
    made them, so this test has a daemon of its own: no window is open when it begins."""
    daemon = daemon_factory()
    channel = grpc.insecure_channel(daemon.grpc_address("inference"))
    live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                               request_serializer=lambda raw: raw,
                               response_deserializer=lambda raw: raw)
    mark = daemon.log_end("grpc.log")
    started = time.monotonic()
    first_answered = None
    for _ in range(40):
        with pytest.raises(grpc.RpcError) as err:
            live(b"\xff\x01", timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # each is still answered
        first_answered = first_answered or time.monotonic()
    assert time.monotonic() - started < 10  # all in one window
    # The window opened with the first call's line, logged before that call was answered, so
    # it is over 10 s after the answer (one clock: CLOCK_MONOTONIC is the machine's). Nothing
    # shows it closing but the next line, and a call sent while it is open would be held.
    time.sleep(max(0.0, first_answered + 10.0 - time.monotonic()))
    with pytest.raises(grpc.RpcError):
        live(b"\xff\x01", timeout=30)
    daemon.wait_for_log("grpc.log", "(and 30 more like this in the 10 s before, not logged)",
                        since=mark)
    assert daemon.read_log("grpc.log", mark).count("that is no protobuf message") == 11
    channel.close()


def test_torchserve_grpc_ping_predictions_and_management(daemon) -> None:
    from google.protobuf import empty_pb2

    from mservd.frontends.grpc.generated import (
        inference_pb2,
        inference_pb2_grpc,
        management_pb2,
        management_pb2_grpc,
    )

    inference = grpc.insecure_channel(daemon.grpc_address("inference"))
    management = grpc.insecure_channel(daemon.grpc_address("management"))
    infer_stub = inference_pb2_grpc.InferenceAPIsServiceStub(inference)
    manage_stub = management_pb2_grpc.ManagementAPIsServiceStub(management)
    ikey = (("authorization", f"Bearer {daemon.key('inference')}"),)
    mkey = (("authorization", f"Bearer {daemon.key('management')}"),)

    health = infer_stub.Ping(empty_pb2.Empty(), timeout=30)
    assert json.loads(health.health)["status"] == "Healthy"

    values = tiny_input(7)
    expected = daemon.predict("tiny", json=values).json()
    answer = infer_stub.Predictions(inference_pb2.PredictionsRequest(
        model_name="tiny", input={"data": json.dumps(values).encode()}), metadata=ikey,
        timeout=60)
    assert json.loads(answer.prediction) == expected
    with pytest.raises(grpc.RpcError) as err:
        infer_stub.Predictions(inference_pb2.PredictionsRequest(
            model_name="nope", input={"data": b"[]"}), metadata=ikey, timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    reply = manage_stub.RegisterModel(management_pb2.RegisterModelRequest(
        url="echo.mar", model_name="grpcecho", initial_workers=1, synchronous=True),
        metadata=mkey, timeout=120)
    assert 'Model "grpcecho" Version: 1.0 registered' in json.loads(reply.msg)["status"]
    reply = manage_stub.ScaleWorker(management_pb2.ScaleWorkerRequest(
        model_name="grpcecho", min_worker=2, max_worker=2, synchronous=True),
        metadata=mkey, timeout=120)
    assert "Workers scaled to 2" in json.loads(reply.msg)["status"]
    described = json.loads(manage_stub.DescribeModel(management_pb2.DescribeModelRequest(
        model_name="grpcecho"), metadata=mkey, timeout=30).msg)
    assert described[0]["modelName"] == "grpcecho" and len(described[0]["workers"]) == 2
    listed = json.loads(manage_stub.ListModels(management_pb2.ListModelsRequest(),
                                               metadata=mkey, timeout=30).msg)
    assert "grpcecho" in [m["modelName"] for m in listed["models"]]
    reply = manage_stub.UnregisterModel(management_pb2.UnregisterModelRequest(
        model_name="grpcecho"), metadata=mkey, timeout=60)
    assert json.loads(reply.msg)["status"] == 'Model "grpcecho" unregistered'
    with pytest.raises(grpc.RpcError) as err:
        manage_stub.DescribeModel(management_pb2.DescribeModelRequest(model_name="grpcecho"),
                                  metadata=mkey, timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        manage_stub.ListModels(management_pb2.ListModelsRequest(), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    inference.close()
    management.close()


def test_a_strangers_large_grpc_calls_are_refused_before_their_messages_are_read(
        daemon) -> None:
    """grpc reads a call's whole message before a servicer runs: the token is asked about
    when the call's metadata arrive, so 100 calls of 6 MB with a wrong token cost the gRPC
    frontend little memory (reading them took it from 52 MiB to 1.3 GiB), and a streamed
    one is refused the same way."""
    import threading

    from conftest import grpc_frontend

    from mservd.frontends.grpc.generated import inference_pb2, inference_pb2_grpc

    frontend = grpc_frontend(daemon)
    peak, done = [frontend.memory_info().rss], threading.Event()
    before = peak[0]

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], frontend.memory_info().rss)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    channel = grpc.insecure_channel(daemon.grpc_address("inference"),
                                    options=[("grpc.max_send_message_length", 8 * 2**20)])
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    big = inference_pb2.PredictionsRequest(model_name="tiny", input={"data": b"x" * 6_000_000})
    wrong = (("authorization", "Bearer wrong"),)
    try:
        calls = [stub.Predictions.future(big, metadata=wrong, timeout=60) for _ in range(100)]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call.result()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            list(stub.StreamPredictions(big, metadata=wrong, timeout=60))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "key" in err.value.details().lower() or "token" in err.value.details().lower()
    finally:
        done.set()
        watcher.join()
    assert peak[0] - before < 600 * 2**20, (before >> 20, peak[0] >> 20)
    # the right key is still served, and remembered for the calls after it
    values = tiny_input(3)
    ikey = (("authorization", f"Bearer {daemon.key('inference')}"),)
    for _ in range(2):
        answer = stub.Predictions(inference_pb2.PredictionsRequest(
            model_name="tiny", input={"data": json.dumps(values).encode()}), metadata=ikey,
            timeout=60)
        assert json.loads(answer.prediction) == daemon.predict("tiny", json=values).json()
    channel.close()


@pytest.mark.parametrize("api", ["inference", "management"])
def test_a_key_holder_calling_on_is_served_while_strangers_tokens_fill_the_questions(
        daemon, api: str) -> None:
    """A token the controller accepted is taken without asking for 5 s, and each call
    answered for it starts the 5 s again: a key holder calling for longer than that (a
    prediction, or a management call on the other port) is served every time while
    strangers' unknown tokens keep the gRPC frontend's 64 questions waiting (past which a
    stranger's call is UNAVAILABLE). Before, the key holder's own check came due every 5 s and
    was refused the same way: 25 of its 57 predictions, 49 of its 1,341 management calls."""
    import threading

    from mservd.frontends.grpc.generated import (
        inference_pb2,
        inference_pb2_grpc,
        management_pb2,
        management_pb2_grpc,
    )

    inference = grpc.insecure_channel(daemon.grpc_address("inference"))
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(inference)
    request = inference_pb2.PredictionsRequest(
        model_name="tiny", input={"data": json.dumps(tiny_input(3)).encode()})
    key = (("authorization", f"Bearer {daemon.key(api)}"),)
    if api == "inference":
        def call() -> None:
            stub.Predictions(request, metadata=key, timeout=30)
    else:
        management = grpc.insecure_channel(daemon.grpc_address("management"))
        models = management_pb2_grpc.ManagementAPIsServiceStub(management)

        def call() -> None:
            models.ListModels(management_pb2.ListModelsRequest(), metadata=key, timeout=30)
    call()  # its token is asked about once
    stop, strangers = threading.Event(), {}

    def predict(channel, metadata):
        return inference_pb2_grpc.InferenceAPIsServiceStub(channel).Predictions(
            request, timeout=30, metadata=metadata)

    flooder = threading.Thread(target=strangers_calling,
                               args=(daemon, predict, strangers, stop.is_set))
    flooder.start()
    served: dict[grpc.StatusCode, int] = {}
    try:
        # the key holder calls on until the flood fills the questions (a stranger's call is
        # UNAVAILABLE), and then for 7 s more: past the 5 s its token is taken for
        filled_by = time.monotonic() + 60.0
        until = None
        while until is None or time.monotonic() < until:
            try:
                call()
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
            served[code] = served.get(code, 0) + 1
            if until is None and strangers.get(grpc.StatusCode.UNAVAILABLE, 0) > 0:
                until = time.monotonic() + 7.0
            elif until is None and time.monotonic() > filled_by:
                pytest.fail(f"the strangers' calls never filled the questions: {strangers}")
    finally:
        stop.set()
        flooder.join()
        inference.close()
        if api == "management":
            management.close()
    assert strangers.get(grpc.StatusCode.UNAVAILABLE, 0) > 0, strangers  # 64 were waiting
    assert set(strangers) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE}
    assert set(served) == {grpc.StatusCode.OK}, (served, strangers)


def strangers_calling(daemon, send: Callable[[Any, tuple], Any], codes: dict,
                      done: Callable[[], bool], in_flight: int = 300) -> None:
    """A stranger keeping ``in_flight`` calls on the inference port at all times, each made by
    ``send(aio_channel, metadata)`` with a new unknown token, until ``done()``; the calls'
    codes counted in ``codes``."""
    import asyncio
    import secrets

    async def caller(channel) -> None:
        while not done():
            call = send(channel, (("authorization", f"Bearer {secrets.token_hex(8)}"),))
            try:
                await call
            except grpc.RpcError:
                pass
            code = await call.code()
            codes[code] = codes.get(code, 0) + 1

    async def calls() -> None:
        async with grpc.aio.insecure_channel(daemon.grpc_address("inference")) as channel:
            await asyncio.gather(*(caller(channel) for _ in range(in_flight)))

    asyncio.run(calls())


def test_strangers_v2_metadata_calls_are_spaced_as_over_http(daemon) -> None:
    """v2 ModelMetadata and ModelReady need the inference key and are questions anyone may
    ask: a stranger's, with unknown tokens, are asked one at a time per frontend process and
    spaced, as over HTTP, so a flood of them holds the controller a small share of its time
    (each went to the controller before: 30 % of its time, against 4 % now)."""
    import time

    from conftest import controller_busy_during
    from tritonclient.grpc import service_pb2 as pb  # the same protos, as Triton's clients
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    codes: dict = {}

    def metadata(channel, metadata):
        return pb_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
            pb.ModelMetadataRequest(name="tiny"), timeout=30, metadata=metadata)

    def flood(until: float) -> None:
        strangers_calling(daemon, metadata, codes, lambda: time.monotonic() > until, 100)

    busy, seconds = controller_busy_during(daemon, [flood], 4)
    assert codes.get(grpc.StatusCode.UNAUTHENTICATED, 0) > 0, codes
    assert set(codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE}, codes
    assert busy < 0.2 * seconds, (busy, seconds, codes)
