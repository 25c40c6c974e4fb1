"""The wire frames: every message round-trips through its builder and parser, and garbage is a
ProtocolError, not a crash."""

from __future__ import annotations

import time

import pytest

from mservd import protocol


def test_protocol_prediction_round_trips_its_route_and_forwards_the_rest_untouched() -> None:
    for timeout, explain in ((None, False), (250.0, True)):
        frames = protocol.prediction(b"rid", "m", "1.0", "tok", protocol.CODEC_V2,
                                     [("v2", "x")], {"h": "v"}, [b"x"], explain=explain,
                                     timeout_ms=timeout, sent=12.5)
        assert protocol.kind_of(frames) == protocol.PREDICT
        assert protocol.parse_route(frames[1]) == protocol.Route(b"rid", "m", "1.0", "tok",
                                                                 timeout, explain, 12.5, 1)
        assert frames[3:] == [b"x"]


def test_protocol_one_predict_message_carries_a_frontends_requests_of_one_loop_turn() -> None:
    sent = [protocol.prediction(b"r1", "m", None, None, protocol.CODEC_TORCHSERVE,
                                [("a", "x"), ("b", "y")], {}, [b"A", b"B"]),
            protocol.prediction(b"r2", "n", "2", None, protocol.CODEC_V2, [], {}, []),
            protocol.prediction(b"r3", "m", None, None, protocol.CODEC_TORCHSERVE,
                                [("body", "z")], {}, [b"C"])]
    message = protocol.predictions(sent)
    assert protocol.kind_of(message) == protocol.PREDICT
    got = list(protocol.parse_predictions(message[1:]))
    assert [(route.rid, route.model, parts) for route, parts in got] == [
        (b"r1", "m", sent[0][2:]), (b"r2", "n", sent[1][2:]), (b"r3", "m", sent[2][2:])]


def test_protocol_predict_message_announcing_more_inputs_than_it_has_is_an_error() -> None:
    good = protocol.prediction(b"r1", "m", None, None, protocol.CODEC_TORCHSERVE,
                               [("body", "z")], {}, [b"C"])
    short = protocol.prediction(b"r2", "m", None, None, protocol.CODEC_TORCHSERVE,
                                [("a", "x"), ("b", "y")], {}, [b"A", b"B"])[:-1]
    requests = protocol.parse_predictions(protocol.predictions([good, short])[1:])
    assert next(requests)[0].rid == b"r1"  # the good one before it is kept
    with pytest.raises(protocol.ProtocolError, match="announces 2 inputs"):
        next(requests)
    with pytest.raises(protocol.ProtocolError, match="input count"):
        protocol.parse_route(protocol.packb([b"r", "m", None, None, None, False, 1.0, -1, None,
                                             False]))


def test_protocol_route_carries_the_frontends_send_time_on_the_shared_clock() -> None:
    before = time.monotonic()
    frames = protocol.prediction(b"rid", "m", None, None, protocol.CODEC_TORCHSERVE, [], {}, [])
    assert before <= protocol.parse_route(frames[1]).sent <= time.monotonic()
    with pytest.raises(protocol.ProtocolError, match="send time"):
        protocol.parse_route(protocol.packb([b"r", "m", None, None, None, False, "soon", 0,
                                             None, False]))


def test_protocol_batch_carries_each_requests_codec_inputs_headers_and_kind() -> None:
    requests = [
        protocol.Request(b"r1", protocol.CODEC_TORCHSERVE,
                         [("a", "text/plain"), ("b", "image/png")], {"h": "v"}, [b"A", b"B"]),
        protocol.Request(b"r2", protocol.CODEC_KSERVE_V1, [("body", "application/json")], {},
                         [b"{}"], kind=protocol.EXPLANATION),
        protocol.Request(b"r3", protocol.CODEC_TORCHSERVE, [], {}, [], kind=protocol.DESCRIPTION),
    ]
    frames = protocol.batch_of(requests)
    assert protocol.kind_of(frames) == protocol.BATCH
    assert protocol.parse_batch(frames[1:]) == requests


def test_protocol_controller_batch_forwards_the_predictions_meta_and_payloads() -> None:
    sent = protocol.prediction(b"r", "m", None, None, protocol.CODEC_TORCHSERVE,
                               [("body", "text/plain")], {}, [b"hi"], explain=True)
    route = protocol.parse_route(sent[1])
    [request] = protocol.parse_batch(
        protocol.batch([(route.rid, protocol.EXPLANATION, b"frontend", sent[2:], None)])[1:])
    assert (request.rid, request.kind, request.fid, request.payloads) == (
        b"r", protocol.EXPLANATION, b"frontend", [b"hi"])


def test_protocol_route_carries_the_clients_sequence_headers() -> None:
    plain = protocol.parse_route(protocol.prediction(
        b"r", "m", None, None, protocol.CODEC_TORCHSERVE, [], {}, [])[1])
    assert (plain.sequence, plain.ends_sequence) == (None, False)
    for end, ends in (("true", True), ("True", True), ("1", False), ("false", False),
                      ("", False)):
        route = protocol.parse_route(protocol.prediction(
            b"r", "m", None, None, protocol.CODEC_TORCHSERVE, [],
            {"ts_request_sequence_id": "seq-7", "ts_request_sequence_end": end}, [])[1])
        assert (route.sequence, route.ends_sequence) == ("seq-7", ends)
    with pytest.raises(protocol.ProtocolError, match="sequence id"):
        protocol.parse_route(protocol.packb([b"r", "m", None, None, None, False, 1.0, 0, 7,
                                             False]))


def test_protocol_server_headers_reach_the_handler_over_the_clients_own() -> None:
    sent = protocol.prediction(b"r", "m", None, None, protocol.CODEC_TORCHSERVE,
                               [("body", "text/plain")],
                               {"ts_request_sequence_id": "mine", "x": "1"}, [b"hi"])
    server = {"ts_request_sequence_id": "ts-seq-1", "ts_request_sequence_start": "true"}
    [request] = protocol.parse_batch(
        protocol.batch([(b"r", protocol.PREDICTION, b"f", sent[2:], server)])[1:])
    assert request.server_headers == server
    assert request.handler_headers() == {"ts_request_sequence_id": "ts-seq-1",
                                         "ts_request_sequence_start": "true", "x": "1"}
    with pytest.raises(protocol.ProtocolError, match="job header"):
        protocol.parse_batch([protocol.packb([b"r", 0, b"f", "not a dict"]), sent[2], sent[3]])


@pytest.mark.parametrize("frames", [
    [protocol.packb([b"r1", False, b""]),
     protocol.packb(["torchserve", [["a", "x"], ["b", "y"]], {}]), b"only-one"],
    [protocol.packb([b"r1", False, b""])],
    [protocol.packb([b"r1", False, b""]), b"\xc1not msgpack"],
    [protocol.packb([b"r1", False, b""]), protocol.packb(["no-such-codec", [], {}])],
    [b"r1", protocol.packb(["torchserve", [], {}])],
    [protocol.packb([b"r1", False]), protocol.packb(["torchserve", [], {}])],
    [protocol.packb([b"r1", False, "not bytes"]), protocol.packb(["torchserve", [], {}])],
])
def test_protocol_malformed_batch_is_a_protocol_error(frames) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_batch(frames)


def test_protocol_results_round_trip_through_done_reply_and_chunk() -> None:
    results = [protocol.Result(b"a", protocol.head(200, "text/plain", {"x": "1"}), b"A"),
               protocol.Result(b"b", protocol.head(404), b"{}")]
    frames = protocol.done(results)
    assert protocol.parse_results(frames[1:]) == results
    grouped = protocol.replies(results)  # one REPLY answers several requests of a frontend
    assert protocol.kind_of(grouped) == protocol.REPLY
    assert protocol.parse_results(grouped[1:]) == results
    parts = protocol.chunks(results)  # one CHUNK carries a generation step's parts
    assert protocol.kind_of(parts) == protocol.CHUNK
    assert protocol.parse_results(parts[1:]) == results
    assert protocol.Head.parse(results[0].head) == protocol.Head(200, "text/plain", {"x": "1"})
    reply = protocol.Reply.from_result(results[0])
    assert (reply.status, reply.content_type, reply.body) == (200, "text/plain", b"A")
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_results([b"a", b"head"])


def test_protocol_answered_carries_ids_and_heads_without_bodies() -> None:
    results = [protocol.Result(b"a", protocol.head(200), b"a big body"),
               protocol.Result(b"b", protocol.head(503), b"{}")]
    frames = protocol.answered(results)
    assert protocol.kind_of(frames) == protocol.ANSWERED
    assert frames[1:] == [b"a", results[0].head, b"b", results[1].head]
    assert protocol.parse_answered(frames[1:]) == [
        protocol.Result(b"a", results[0].head, b""), protocol.Result(b"b", results[1].head, b"")]
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_answered([b"a"])


def test_protocol_reply_sockets_live_in_the_controllers_run_folder() -> None:
    address = protocol.reply_endpoint("ipc:///tmp/mservd-x/frontend.sock", 42, "ab12")
    assert address == "ipc:///tmp/mservd-x/reply-42-ab12.sock"
    prefix = protocol.reply_prefix("ipc:///tmp/mservd-x/backend.sock")
    assert address.encode().startswith(prefix)
    assert not b"ipc:///tmp/other/reply-1-x.sock".startswith(prefix)
    # a controller on TCP gives its frontends no reply socket, and its workers none to use
    assert protocol.reply_endpoint("tcp://127.0.0.1:5555", 42, "ab12") is None
    assert protocol.reply_prefix("tcp://127.0.0.1:5556") is None


def test_protocol_management_calls_and_worker_reports_round_trip() -> None:
    call = protocol.ManageCall(b"id", "scale", {"min_worker": 2}, "tok", protocol.API_INFERENCE)
    assert protocol.parse_manage(protocol.manage(call)[1]) == call
    failure = protocol.LoadFailure("ImportError: x", "Traceback ...")
    assert protocol.parse_failed(protocol.failed(failure)[1]) == failure
    samples = [protocol.Sample("m", 1.5, "ms", "gauge", {"d": "v"})]
    assert protocol.parse_metrics(protocol.metrics(samples)[1]) == samples
    with pytest.raises(protocol.ProtocolError, match="id"):
        protocol.parse_manage(protocol.packb({"op": 1}))


def test_protocol_unknown_kind_and_bad_route_are_protocol_errors() -> None:
    with pytest.raises(protocol.ProtocolError, match="unknown message kind"):
        protocol.kind_of([b"HTTP/1.1 GET"])
    with pytest.raises(protocol.ProtocolError, match="10-item array"):
        protocol.parse_route(protocol.packb(["too", "short"]))


def test_protocol_leases_round_trip_and_a_malformed_one_is_an_error() -> None:
    grant = protocol.Lease("m", "1.0", True, "ipc:///run/jobs-7.sock", 8, 120.0)
    [kind, frame] = protocol.lease(grant)
    assert kind == protocol.LEASE and protocol.parse_lease(frame) == grant
    keyed = protocol.Lease("m", "1.0", True, "ipc:///run/jobs-7.sock", 8, 120.0, b"\x01" * 32,
                           1.8e9)
    assert protocol.parse_lease(protocol.lease(keyed)[1]) == keyed
    for bad in ({"model": "m"}, {**protocol.unpackb(frame), "batch": 0}, [1, 2],
                {**protocol.unpackb(frame), "key": b"digest"},  # a key with no expiry
                {**protocol.unpackb(frame), "key": "text", "expires": 1.0}):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_lease(protocol.packb(bad))
    assert protocol.revoke("ipc:///run/jobs-7.sock", True) == [
        protocol.REVOKE, b"ipc:///run/jobs-7.sock", b"1"]
    assert protocol.overdue("ipc:///run/jobs-7.sock") == [protocol.OVERDUE,
                                                          b"ipc:///run/jobs-7.sock"]


def test_protocol_served_reports_several_leased_batches_bodies_only_where_undelivered() -> None:
    a = protocol.Result(b"a", protocol.head(200), b"answer a")
    b = protocol.Result(b"b", protocol.head(500), b"answer b")
    frames = protocol.served([protocol.Served(b"f1", True, 0.25, [a]),
                              protocol.Served(b"f2", False, 0.5, [b])])
    assert frames[0] == protocol.SERVED
    first, second = protocol.parse_served(frames[1:])
    assert first == protocol.Served(b"f1", True, 0.25, [protocol.Result(b"a", a.head, b"")])
    assert second == protocol.Served(b"f2", False, 0.5, [b])
    with pytest.raises(protocol.ProtocolError):  # counts more answers than it carries
        protocol.parse_served([protocol.packb([[b"f1", True, 0.1, 2]]), b"a", a.head, b""])


def test_protocol_a_worker_names_its_job_socket_in_the_run_folder_when_ready() -> None:
    assert protocol.job_endpoint("ipc:///run/mservd/backend.sock", 42) == \
        "ipc:///run/mservd/jobs-42.sock"
    assert protocol.job_endpoint("tcp://127.0.0.1:5555", 42) is None
    [_, frame] = protocol.ready(42, "ipc:///run/mservd/jobs-42.sock")
    assert protocol.parse_ready(frame) == "ipc:///run/mservd/jobs-42.sock"
    assert protocol.parse_ready(protocol.ready(42)[1]) is None


def test_a_job_socket_message_round_trips_and_one_too_big_or_cut_short_is_refused() -> None:
    frames = [protocol.BATCH, b"", b"x" * 1000]
    assert protocol.parse_job_message(protocol.job_message(frames)) == frames
    assert protocol.job_message([b"x" * protocol.JOB_MESSAGE_MAX]) is None  # the ZeroMQ way
    whole = protocol.job_message(frames)
    for cut in (whole[:2], whole[:-1]):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_job_message(cut)


def test_protocol_route_carries_the_workflow_flag_as_item_12_and_older_routes_still_parse(
        ) -> None:
    frames = protocol.prediction(b"r", "wf", None, None, protocol.CODEC_TORCHSERVE,
                                 [("body", "")], {}, [b"x"], workflow=True)
    assert len(protocol.unpackb(frames[1])) == 12
    assert protocol.parse_route(frames[1]).workflow is True
    plain = protocol.prediction(b"r", "m", None, None, protocol.CODEC_TORCHSERVE,
                                [("body", "")], {}, [b"x"])
    assert len(protocol.unpackb(plain[1])) == 11
    assert protocol.parse_route(plain[1]).workflow is False
    ten = protocol.packb([b"r", "m", None, None, None, False, 1.0, 0, None, False])
    assert protocol.parse_route(ten).workflow is False
    with pytest.raises(protocol.ProtocolError, match="workflow flag"):
        protocol.parse_route(protocol.packb([b"r", "m", None, None, None, False, 1.0, 0, None,
                                             False, None, "yes"]))
