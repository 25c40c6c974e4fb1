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


PATH = "/predictions/m"
REFUSED = b'{"refused": 1}'


def clock(monkeypatch) -> list[float]:
    import mservd.frontends.http.shedding as shedding

    now = [100.0]
    monkeypatch.setattr(shedding.time, "monotonic", lambda: now[0])
    return now


def fill(door: Door, count: int) -> None:
    """``count`` predictions let in, none answered yet."""
    for _ in range(count):
        assert door.refusal(PATH) is None
        door.let_in(PATH)


def refused_by_controller(door: Door, seconds: float = 0.001) -> None:
    """One prediction in flight is refused by the controller, ``seconds`` after it came."""
    door.answered(PATH, None, 503, seconds, True, REFUSED)


def test_door_after_a_controller_refusal_lets_in_a_tenth_less_than_it_had_in_flight(
        monkeypatch) -> None:
    clock(monkeypatch)
    door = Door(0)
    fill(door, 21)
    refused_by_controller(door)  # 20 left in flight: the cap is 0.9 * 21, 18.9
    assert door.refusal(PATH) == REFUSED  # 20 in flight: the controller never sees it
    for _ in range(2):  # each answer grows the cap by 1 / cap: 19.006 now
        door.answered(PATH, None, 200, 0.001, False, b"{}")
    fill(door, 1)  # 18 in flight let one in
    assert door.refusal(PATH) is None  # 19 in flight: one more fits
    door.let_in(PATH)
    assert door.refusal(PATH) == REFUSED  # 20


def test_door_cuts_its_cap_once_per_round_of_refusals(monkeypatch) -> None:
    now = clock(monkeypatch)
    door = Door(0)
    fill(door, 40)
    refused_by_controller(door)  # cap 36
    now[0] += 0.005
    for _ in range(10):  # sent before that cut: they teach nothing new
        refused_by_controller(door, seconds=0.01)
    assert door.backoffs[PATH].cap == 36
    refused_by_controller(door, seconds=0.001)  # sent under the cap: cut again, to 0.9 * 29
    assert round(door.backoffs[PATH].cap, 6) == round(0.9 * 29, 6)


def test_door_lifts_its_cap_when_the_controller_refuses_nothing_for_half_a_second(
        monkeypatch) -> None:
    from mservd.frontends.http.shedding import LIFT_AFTER

    now = clock(monkeypatch)
    door = Door(0)
    fill(door, 3)
    refused_by_controller(door)  # cap 2.7 ... and never below MIN_CAP
    fill(door, 1)
    assert door.refusal(PATH) == REFUSED
    now[0] += LIFT_AFTER + 0.001
    assert door.refusal(PATH) is None


def test_door_a_refusal_that_is_not_overload_cuts_nothing(monkeypatch) -> None:
    clock(monkeypatch)
    door = Door(0)
    fill(door, 5)
    door.answered(PATH, None, 503, 0.001, False, REFUSED)  # not overload: a deadline of its own
    fill(door, 20)
    assert door.refusal(PATH) is None


def test_door_stops_refusing_for_a_model_whose_clients_spin_on_its_refusals(
        monkeypatch) -> None:
    from mservd.spinning import FLOOR, WINDOW

    now = clock(monkeypatch)
    door = Door(0.05)
    fill(door, 10)
    refused_by_controller(door)  # cap 9, 9 in flight
    for _ in range(FLOOR):  # clients resending at once, nothing answered
        assert door.refusal(PATH) == REFUSED
    now[0] += WINDOW + 0.001
    assert door.refusal(PATH) is None  # through to the controller
    door.let_in(PATH)
    refused_by_controller(door)
    assert door.refusal(PATH) is None  # and not refused here again while it rests


def test_a_refusal_of_a_request_with_its_own_deadline_teaches_the_door_nothing() -> None:
    from mservd.frontends.http.gateway import refused_as_overload
    from mservd.frontends.http.request import HttpRequest
    from mservd.protocol import Reply

    def request(*headers: tuple[bytes, bytes]) -> HttpRequest:
        return HttpRequest({"method": "POST", "path": PATH, "query_string": b"",
                            "headers": list(headers), "http_version": "1.1",
                            "client": ("127.0.0.1", 1)}, None)

    full = Reply(503, REFUSED, {"Retry-After": "1"})
    assert refused_as_overload(full, request())
    assert not refused_as_overload(full, request((b"x-request-timeout-ms", b"20")))
    assert not refused_as_overload(Reply(503, REFUSED, {}), request())  # a worker's own 503


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
