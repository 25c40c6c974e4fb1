"""Hostile gRPC calls against a real daemon with token auth on (issue 45): streams whose
client never reads its answers, typed v2 contents that would expand on the frontend's only
event loop, and calls that carry two keys."""

from __future__ import annotations

import threading

import grpc
import numpy as np
import psutil
import pytest
from conftest import grpc_frontend, wait_until

WRITE_TIMEOUT = 3  # frontend_write_timeout of the daemon below
MiB = 2**20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon, write_archive

    write_archive(store, "manyparts", "streams_many_parts.py")
    daemon = Daemon(tmp_path_factory.mktemp("hostile-grpc"), store,
                    {"load_models": "echo.mar,tiny.mar,manyparts.mar",
                     "frontend_write_timeout": WRITE_TIMEOUT})
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def stub(daemon):
    """TorchServe's inference service on one channel (closed after the module)."""
    from mservd.frontends.grpc.generated import inference_pb2_grpc

    with grpc.insecure_channel(daemon.grpc_address("inference")) as channel:
        yield inference_pb2_grpc.InferenceAPIsServiceStub(channel)


@pytest.fixture(scope="module")
def key(daemon):
    return (("authorization", f"Bearer {daemon.key('inference')}"),)


def predictions(model: str, data: bytes):
    from mservd.frontends.grpc.generated import inference_pb2

    return inference_pb2.PredictionsRequest(model_name=model, input={"data": data})


def echo_is_served(stub, key) -> None:
    answer = stub.Predictions(predictions("echo", b"still here"), metadata=key, timeout=30)
    assert b"still here" in answer.prediction


def read_to_the_end(call) -> tuple[int, grpc.RpcError | None]:
    """The answers a streaming call gives once read, and the error it ends with (None: OK)."""
    answers = 0
    try:
        for _ in call:
            answers += 1
    except grpc.RpcError as exc:
        return answers, exc
    return answers, None


# -- item 6: a client that never reads ----------------------------------------------------


def test_a_stream2_client_that_never_reads_is_no_longer_read_and_is_ended_at_the_deadline(
        daemon, stub, key) -> None:
    """Before, every request of a StreamPredictions2 call was read and answered into a queue
    without bound while the client read nothing (400k requests: +316 MiB, the loop at 100 %)."""
    unbounded = 30_000  # requests the frontend read before in ~12 s; now flow control holds
    pulled = [0]
    stop = threading.Event()

    def requests():
        while not stop.is_set():
            pulled[0] += 1
            yield predictions("echo", b"x" * 1000)

    frontend = grpc_frontend(daemon)
    before = frontend.memory_info().rss
    mark = daemon.log_end("grpc.log")
    call = stub.StreamPredictions2(requests(), metadata=key)  # its answers left unread
    seen: list[int] = []

    def settled() -> bool:  # unchanged for 3 s, or past what a bounded stream takes
        seen.append(pulled[0])
        return pulled[0] >= unbounded or (len(seen) > 30 and seen[-31] == seen[-1])

    try:
        wait_until(settled, 120, "the stream's requests to stop being taken",
                   details=daemon.logs)
        assert pulled[0] < unbounded, f"the frontend read {pulled[0]} requests of a stream " \
                                      "whose answers nobody read"
        echo_is_served(stub, key)
        daemon.wait_for_log("grpc.log", "StreamPredictions2 call's client took no answer",
                            since=mark, timeout=90)
        grown = frontend.memory_info().rss - before
        answers, error = read_to_the_end(call)
    finally:
        stop.set()
        call.cancel()
    assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert "frontend_write_timeout" in error.details()
    assert answers < pulled[0]
    assert grown < 64 * MiB, f"the gRPC frontend grew {grown / MiB:.0f} MiB"
    echo_is_served(stub, key)


def test_a_stream_predictions_client_that_never_reads_is_ended_at_the_write_deadline(
        daemon, stub, key) -> None:
    """StreamPredictions writes each part as the client takes it; one that takes none had the
    handler's parts (32 MB here) pile up in the frontend for as long as it stayed."""
    mark = daemon.log_end("grpc.log")
    call = stub.StreamPredictions(predictions("manyparts", b"go"), metadata=key)
    try:
        daemon.wait_for_log("grpc.log", "StreamPredictions call's client took no answer",
                            since=mark, timeout=90)
        answers, error = read_to_the_end(call)
    finally:
        call.cancel()
    assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert "frontend_write_timeout" in error.details()
    assert answers < 2000  # what the flow-control windows held, then the end
    echo_is_served(stub, key)


# -- item 7: typed v2 contents --------------------------------------------------------------
# tritonclient's own protos, as a Triton user sends them: ours (the same package,
# "inference") cannot be loaded beside them in one process, and other tests load theirs


def model_infer(daemon, request, key):
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    with grpc.insecure_channel(daemon.grpc_address("inference")) as channel:
        return pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=key,
                                                                    timeout=60)


def bytes_request(shape: list[int], elements: int):
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="tiny")
    item = request.inputs.add(name="INPUT0", datatype="BYTES", shape=shape)
    item.contents.bytes_contents.extend([b""] * elements)
    return request


def test_typed_contents_are_counted_against_the_shape_before_any_conversion(
        daemon, key) -> None:
    """3.2 M empty BYTES elements (a 6.4 MB message) under a shape of one cost the frontend's
    only loop 2.5 s of CPU and +240 MiB before the worker refused them."""
    frontend = grpc_frontend(daemon)
    before = frontend.cpu_times()
    with pytest.raises(grpc.RpcError) as err:
        model_infer(daemon, bytes_request([1], 3_200_000), key)
    spent = sum(frontend.cpu_times()[:2]) - sum(before[:2])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == (
        "Input 'INPUT0' has shape [1], so 1 elements, but contents.bytes_contents holds "
        "3200000; send exactly 1 values, one per element, in row-major order.")
    assert spent < 2.0, f"refusing it took the frontend {spent:.1f} s of CPU"
    from tritonclient.grpc import service_pb2 as pb

    wildcard = pb.ModelInferRequest(model_name="tiny")
    wildcard.inputs.add(name="INPUT0", datatype="FP32", shape=[1, -1]).contents.fp32_contents \
        .extend([0.5] * 64)
    with pytest.raises(grpc.RpcError) as err:
        model_infer(daemon, wildcard, key)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no wildcard (-1)" in err.value.details()


def test_typed_contents_that_match_their_shape_are_converted_and_nothing_is_kept(
        daemon, stub, key) -> None:
    """A typed request that matches its shape is answered as its raw twin is; a large one is
    converted on a thread, and what a refused one cost is released: before, each refused
    6.4 MB message stayed in the frontend (+120 MiB a call, in the abort's reference cycle)."""
    from tritonclient.grpc import service_pb2 as pb

    values = np.random.default_rng(7).standard_normal(64).astype(np.float32)
    typed = pb.ModelInferRequest(model_name="tiny")
    typed.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64]).contents.fp32_contents \
        .extend(values.tolist())
    raw = pb.ModelInferRequest(model_name="tiny")
    raw.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    raw.raw_input_contents.append(values.tobytes())
    assert model_infer(daemon, typed, key).raw_output_contents == \
        model_infer(daemon, raw, key).raw_output_contents
    frontend = grpc_frontend(daemon)
    refused = [bytes_request([1], 3_200_000), bytes_request([3_200_000], 3_200_000)]
    with pytest.raises(grpc.RpcError):  # the first large call: grpc's buffers, the thread's
        model_infer(daemon, refused[1], key)
    before = frontend.memory_info().rss
    for request in refused * 3:  # the second's shape matches: converted, refused by tiny
        with pytest.raises(grpc.RpcError) as err:
            model_infer(daemon, request, key)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        echo_is_served(stub, key)
    grown = frontend.memory_info().rss - before
    assert grown < 200 * MiB, f"the gRPC frontend grew {grown / MiB:.0f} MiB"


# -- item 9: two keys -----------------------------------------------------------------------


def test_a_call_with_two_authorization_entries_is_refused_on_both_ports(
        daemon, stub, key) -> None:
    """The guard read the last entry and the servicer the first: one call, two keys."""
    from mservd.frontends.grpc.generated import management_pb2, management_pb2_grpc

    expected = ("The call has 2 'authorization' metadata entries; send exactly one: "
                "authorization: Bearer <key>.")
    good = key[0]
    wrong = ("authorization", "Bearer not-the-key")
    for metadata in ((good, good), (wrong, good), (good, wrong)):
        with pytest.raises(grpc.RpcError) as err:
            stub.Predictions(predictions("echo", b"two keys"), metadata=metadata, timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert err.value.details() == expected
    management = grpc.insecure_channel(daemon.grpc_address("management"))
    manage = management_pb2_grpc.ManagementAPIsServiceStub(management)
    manage_key = ("authorization", f"Bearer {daemon.key('management')}")
    try:
        with pytest.raises(grpc.RpcError) as err:
            manage.ListModels(management_pb2.ListModelsRequest(),
                              metadata=(manage_key, manage_key), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert err.value.details() == expected
        assert "echo" in manage.ListModels(management_pb2.ListModelsRequest(),
                                           metadata=(manage_key,), timeout=30).msg
    finally:
        management.close()
    echo_is_served(stub, key)
    assert psutil.pid_exists(daemon.proc.pid)
