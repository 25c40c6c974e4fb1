"""What ``frontends/http/arbiter.py`` relies on inside gunicorn: it extends gunicorn's ASGI
connection and worker, so a gunicorn that renamed these would break the frontend quietly."""

from __future__ import annotations

import gc
import inspect

from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.workers.gasgi import ASGIWorker
from http_spec import http_frontend_spec

from mservd.frontends.http.arbiter import FrontendProtocol, FrontendServer, FrontendWorker


def test_gunicorn_connection_has_the_methods_frontend_protocol_extends() -> None:
    for name in ("connection_made", "connection_lost", "data_received", "pause_writing",
                 "resume_writing", "_on_headers_complete", "_on_message_complete",
                 "_send_error_response", "_get_reason_phrase", "_safe_write",
                 "_close_transport", "_check_h1c_protocol_available", "_is_websocket_upgrade"):
        assert callable(getattr(ASGIProtocol, name)), name
        if name in vars(FrontendProtocol):
            ours = inspect.signature(getattr(FrontendProtocol, name)).parameters
            theirs = inspect.signature(getattr(ASGIProtocol, name)).parameters
            assert list(ours) == list(theirs), name


def test_gunicorn_connection_keeps_the_state_frontend_protocol_reads() -> None:
    source = inspect.getsource(ASGIProtocol)
    for attribute in ("self._awaiting_request", "self._request_ready", "self._closed",
                      "self._body_receiver", "receiver._complete",
                      "'on_headers_complete': self._on_headers_complete",
                      "'on_message_complete': self._on_message_complete"):
        assert attribute in source, attribute


def test_gunicorn_worker_makes_its_servers_through_the_loop_we_wrap() -> None:
    assert "self.loop.create_server(" in inspect.getsource(ASGIWorker._serve)
    for name in ("_setup_event_loop", "_shutdown"):
        assert callable(getattr(ASGIWorker, name))
        assert name in vars(FrontendWorker)


def test_error_responses_of_the_parser_are_mservd_json() -> None:
    written: list[bytes] = []
    conn = FrontendProtocol.__new__(FrontendProtocol)
    conn._safe_write = written.append  # type: ignore[method-assign]
    conn._send_error_response(431, "Request header fields too large")
    head, body = written[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 431 ")
    assert b"Content-Type: application/json" in head
    assert body == (b'{"code": 431, "type": "RequestHeaderFieldsTooLarge", '
                    b'"message": "Request header fields too large."}')


def test_what_the_workers_inherit_from_the_arbiter_is_never_collected() -> None:
    gc.unfreeze()
    try:
        app = FrontendServer(http_frontend_spec()).load()
        assert gc.get_freeze_count() > 0
        assert not any(o is app for o in gc.get_objects())  # frozen: no collection walks it
    finally:
        gc.unfreeze()


def test_a_door_refusal_carries_the_cors_headers_every_answer_does() -> None:
    from types import SimpleNamespace

    worker = FrontendWorker.__new__(FrontendWorker)
    worker.refusals = {}
    worker.app = SimpleNamespace(spec=http_frontend_spec(
        cors={"Access-Control-Allow-Origin": "https://app.example"}))
    answer = worker.refusal_answer(b'{"code": 503}', keep_alive=True)
    head = answer.split(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"HTTP/1.1 503 Service Unavailable"
    assert b"Access-Control-Allow-Origin: https://app.example" in head


def test_the_door_lets_a_browsers_preflight_by_and_refuses_the_prediction(monkeypatch) -> None:
    import asyncio
    from types import SimpleNamespace

    served: list[str] = []

    async def gunicorn_serves(self, request, sockname, peername):
        served.append(request.method)
        return True

    monkeypatch.setattr(ASGIProtocol, "_serve_http_request", gunicorn_serves)
    door = SimpleNamespace(refusal=lambda path: b'{"code": 503}')  # the model is overloaded
    conn = FrontendProtocol.__new__(FrontendProtocol)
    conn._inference, conn._body_receiver, written = True, None, []
    conn._safe_write = written.append  # type: ignore[method-assign]
    conn.worker = SimpleNamespace(
        asgi=SimpleNamespace(inference=SimpleNamespace(door=door), access=None),
        refusal_answer=lambda body, keep_alive: b"HTTP/1.1 503 " + body)
    for method in ("OPTIONS", "POST"):
        request = SimpleNamespace(method=method, path="/predictions/m", query="",
                                  version=(1, 1), should_close=lambda: False)
        asyncio.run(conn._serve_http_request(request, None, ("127.0.0.1", 1)))
    assert served == ["OPTIONS"]  # the preflight reached the app (and its CORS answer)
    assert written == [b'HTTP/1.1 503 {"code": 503}']  # the prediction was refused at the door
