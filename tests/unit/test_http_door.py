"""The HTTP frontend's door, in one process: what a model's limit lets in is counted as it is
let in, so requests arriving together cannot all pass the same check."""

from __future__ import annotations

import json

from mservd.frontends.http.shedding import Door, ModelLimit, is_kserve_prediction


def test_door_counts_each_prediction_as_it_is_let_in() -> None:
    door = Door(0.05)
    limit = door.limits["/predictions/m"] = ModelLimit(0.05)
    limit.allowed = 2  # as if its ticks had set it: two in flight from this process
    let_in = []
    for _ in range(3):  # three arrive before any is answered
        if door.refusal("/predictions/m") is None:
            let_in.append(door.let_in("/predictions/m"))
    assert let_in == [limit, limit] and limit.busy == 2
    assert limit.refused == 1
    door.answered("/predictions/m", limit, 200, 0.01, False, b"")
    assert limit.busy == 1
    assert door.refusal("/predictions/m") is None  # room again


def test_door_refuses_in_torchserve_shape_on_predictions() -> None:
    door = Door(0.05)
    door.limits["/predictions/m"] = limit = ModelLimit(0.05)
    limit.allowed = 0
    refusal = json.loads(door.refusal("/predictions/m"))
    assert refusal["code"] == 503 and refusal["type"] == "ServiceUnavailableException"
    assert "0 of its predictions are in flight from this frontend" in refusal["message"]


def test_door_refuses_a_kserve_prediction_in_kserve_shape() -> None:
    door = Door(0.05)
    door.limits["/v2/models/m/infer"] = limit = ModelLimit(0.05)
    limit.allowed = 1
    assert door.refusal("/v2/models/m/infer") is None
    door.let_in("/v2/models/m/infer")
    body = json.loads(door.refusal("/v2/models/m/infer"))
    assert list(body) == ["error"]  # what KServe and Triton clients read
    assert "1 of its predictions are in flight" in body["error"]


def test_door_holds_a_controller_refusal_for_a_moment(monkeypatch) -> None:
    from mservd.frontends.http import shedding

    now = [100.0]
    monkeypatch.setattr(shedding.time, "monotonic", lambda: now[0])
    door = Door(0.05)
    door.answered("/predictions/m", None, 503, 0.001, True, b'{"refused": 1}')
    assert door.refusal("/predictions/m") == b'{"refused": 1}'
    now[0] += shedding.REFUSAL_HOLD + 0.001
    assert door.refusal("/predictions/m") is None


def test_door_stops_holding_refusals_its_clients_spin_on(monkeypatch) -> None:
    from mservd.core.spinning import SPIN_FLOOR, WINDOW
    from mservd.frontends.http import shedding

    now = [100.0]
    monkeypatch.setattr(shedding.time, "monotonic", lambda: now[0])
    door = Door(0.05)
    door.answered("/predictions/m", None, 503, 0.001, True, b'{"refused": 1}')
    for _ in range(SPIN_FLOOR):  # clients resending at once, nothing answered
        assert door.refusal("/predictions/m") == b'{"refused": 1}'
    now[0] += WINDOW + 0.001
    assert door.refusal("/predictions/m") is None  # through to the controller
    door.answered("/predictions/m", None, 503, 0.001, True, b'{"refused": 1}')
    assert door.refusal("/predictions/m") is None  # and not held again while it rests


def test_a_refusal_of_a_request_with_its_own_deadline_teaches_the_door_nothing() -> None:
    from mservd.frontends.http.gateway import refused_as_overload
    from mservd.frontends.http.request import HttpRequest
    from mservd.protocol import Reply

    def request(*headers: tuple[bytes, bytes]) -> HttpRequest:
        return HttpRequest({"method": "POST", "path": "/predictions/m", "query_string": b"",
                            "headers": list(headers), "http_version": "1.1",
                            "client": ("127.0.0.1", 1)}, None)

    full = Reply(503, b'{"refused": 1}', {"Retry-After": "1"})
    assert refused_as_overload(full, request())
    assert not refused_as_overload(full, request((b"x-request-timeout-ms", b"20")))
    assert not refused_as_overload(Reply(503, b'{"refused": 1}', {}), request())  # a worker's own 503


def test_door_learns_a_model_only_once_it_answers() -> None:
    door = Door(0.05)
    door.answered("/predictions/typo", None, 404, 0.001, False, b"")
    assert door.limits == {}
    door.answered("/predictions/m", None, 200, 0.001, False, b"")
    assert "/predictions/m" in door.limits


def test_only_prediction_routes_pass_the_door() -> None:
    assert is_kserve_prediction("/v2/models/m/infer")
    assert is_kserve_prediction("/v2/models/m/versions/2/infer")
    assert is_kserve_prediction("/v1/models/m:predict")
    assert is_kserve_prediction("/v1/models/m:explain")
    assert not is_kserve_prediction("/v2/models/m/ready")
    assert not is_kserve_prediction("/v2/models/m")
    assert not is_kserve_prediction("/v1/models/m")
