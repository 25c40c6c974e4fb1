"""The wire frames: what goes in comes out, and garbage is a ProtocolError, not a crash."""

from __future__ import annotations

import pytest

from mservd import protocol


def test_protocol_route_round_trips_with_and_without_a_timeout() -> None:
    for timeout in (None, 250.0):
        route = protocol.Route(b"rid", "m", "1.0", "tok", protocol.API_INFERENCE, timeout, 12.5)
        frames = protocol.predict_frames(route, b"meta", [b"x", b"y"])
        assert protocol.kind_of(frames) == protocol.PREDICT
        assert protocol.parse_route(frames[1]) == route
        assert frames[2:] == [b"meta", b"x", b"y"]


def test_protocol_route_carries_the_frontends_send_time_on_the_shared_clock() -> None:
    import time

    before = time.monotonic()
    route = protocol.Route(b"rid", "m", None, None, protocol.API_INFERENCE)
    sent = protocol.parse_route(protocol.predict_frames(route, b"meta", [])[1]).sent
    assert before <= sent <= time.monotonic()
    with pytest.raises(protocol.ProtocolError, match="send time"):
        protocol.parse_route(protocol.packb([b"r", "m", None, None, "i", None, "soon"]))


def test_protocol_batch_splits_into_requests_by_their_input_counts() -> None:
    meta_two = protocol.pack_meta([("a", "text/plain"), ("b", "image/png")], {"h": "v"}, False)
    meta_one = protocol.pack_meta([("body", "application/json")], {}, True)
    requests = protocol.parse_batch([b"r1", meta_two, b"A", b"B", b"r2", meta_one, b"{}"])
    assert [(r.rid, r.payloads, r.explain) for r in requests] == [
        (b"r1", [b"A", b"B"], False), (b"r2", [b"{}"], True)]
    assert requests[0].inputs == [("a", "text/plain"), ("b", "image/png")]
    assert requests[0].headers == {"h": "v"}


@pytest.mark.parametrize("frames", [
    [b"r1", protocol.pack_meta([("a", "x"), ("b", "y")], {}, False), b"only-one"],
    [b"r1"],
    [b"r1", b"\xc1not msgpack"],
])
def test_protocol_malformed_batch_is_a_protocol_error(frames) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_batch(frames)


def test_protocol_unknown_kind_and_bad_route_are_protocol_errors() -> None:
    with pytest.raises(protocol.ProtocolError, match="unknown message kind"):
        protocol.kind_of([b"HTTP/1.1 GET"])
    with pytest.raises(protocol.ProtocolError, match="7-item array"):
        protocol.parse_route(protocol.packb(["too", "short"]))
