"""One BATCH through the worker's path: a request's content fails that request alone."""

from __future__ import annotations

import json

from handlers.context import Context
from mservd import protocol
from mservd.worker.batches import answer_batch


class Echo:
    def handle(self, data, context):
        return [row.get("body") for row in data]


class Deep:
    """Returns, for a request whose body is "deep", a value too nested for json.dumps."""

    def handle(self, data, context):
        out = []
        for row in data:
            value: list = []
            if row.get("body") == "deep":
                for _ in range(100_000):
                    value = [value]
            out.append(value if row.get("body") == "deep" else row.get("body"))
        return out


def batch(*requests: tuple[bytes, str, bytes]) -> list[bytes]:
    """A BATCH's frames after its kind; a content type "kserve-v1" makes a KServe V1 request."""
    return protocol.batch_of(
        protocol.Request(rid, protocol.CODEC_KSERVE_V1, [("body", "application/json")], {},
                         [body]) if content_type == "kserve-v1" else
        protocol.Request(rid, protocol.CODEC_TORCHSERVE, [("body", content_type)], {}, [body])
        for rid, content_type, body in requests)[1:]


def run_batch(handler, context, frames: list[bytes], max_response_size: int):
    """The BATCH's frames through the worker's path, as ``serve`` runs them."""
    return answer_batch(handler, context, protocol.parse_batch(frames), max_response_size)


def answers(results: list[protocol.Result]) -> dict[bytes, tuple[int, object]]:
    """rid -> (status, body): JSON bodies parsed, text ones as str."""
    out = {}
    for result in results:
        head = protocol.Head.parse(result.head)
        body = result.body
        out[result.rid] = (head.status,
                           json.loads(body) if "json" in head.content_type else body.decode())
    return out


def context() -> Context:
    return Context("m", ".", {"model": {"modelVersion": "1.0"}}, 8, None, "mservd")


def test_worker_undecodable_request_is_400_and_its_batch_mates_are_computed() -> None:
    got = answers(run_batch(Echo(), context(), batch(
        (b"a", "application/json", b'{"x": 1}'),
        (b"deep", "application/json", b"[" * 3000),
        (b"bad-charset", "text/plain; charset=undefined", b"hi"),
        (b"v1", "kserve-v1", b"[" * 3000),
    ), 1 << 20))
    assert got[b"a"] == (200, {"x": 1})
    assert got[b"deep"][0] == 400
    assert got[b"deep"][1]["message"] == "The JSON body is nested too deeply to parse."
    assert got[b"bad-charset"] == (200, "hi")  # an unusable charset: the raw bytes, as text/*
    assert got[b"v1"] == (400, {"error": "The JSON body is nested too deeply to parse."})


def test_worker_output_that_cannot_be_encoded_fails_its_own_request_only() -> None:
    got = answers(run_batch(Deep(), context(), batch(
        (b"ok", "text/plain", b"fine"), (b"deep", "text/plain", b"deep")), 1 << 20))
    assert got[b"ok"] == (200, "fine")
    assert got[b"deep"][0] == 500
    assert "cannot be encoded" in got[b"deep"][1]["message"]


def test_worker_names_an_unexpected_decode_failure_by_its_type(monkeypatch) -> None:
    from mservd.worker.codecs import torchserve

    def broken(content_type, body):
        raise KeyError("surprise")

    monkeypatch.setattr(torchserve, "decode_input", broken)
    got = answers(run_batch(Echo(), context(), batch(
        (b"a", "application/octet-stream", b"x")), 1 << 20))
    assert got[b"a"][0] == 400
    assert got[b"a"][1]["message"] == ("The request's input cannot be decoded: "
                                       "KeyError: 'surprise'")


class ExplainSeen:
    """Answers whether the handler saw each row as an explanation or a describe question, as
    TorchServe shows them."""

    def handle(self, data, context):
        return [f'{context.get_request_header(i, "explain") or "no"}/'
                f'{context.get_request_header(i, "describe") or "no"}' for i in range(len(data))]


def test_worker_shows_an_explanation_to_the_handler_as_torchserve_does() -> None:
    frames = protocol.batch_of([
        protocol.Request(b"e", protocol.CODEC_TORCHSERVE, [("body", "text/plain")], {}, [b"x"],
                         kind=protocol.EXPLANATION)])[1:]
    got = answers(run_batch(ExplainSeen(), context(), frames, 1 << 20))
    assert got == {b"e": (200, "True/no")}


def test_a_clients_own_explain_or_describe_header_never_reaches_the_handler() -> None:
    # one request of a batch could otherwise turn its batch-mates' predictions into
    # explanations, or fail them with a describe document (BaseHandler reads row 0's marks)
    forged = {"Explain": "true", "describe": "True", "x-trace": "t"}
    frames = protocol.batch_of([
        protocol.Request(b"p", protocol.CODEC_TORCHSERVE, [("body", "text/plain")], forged,
                         [b"x"]),
        protocol.Request(b"q", protocol.CODEC_TORCHSERVE, [], {}, [], kind=protocol.DESCRIPTION),
    ])[1:]
    got = answers(run_batch(ExplainSeen(), context(), frames, 1 << 20))
    assert got == {b"p": (200, "no/no"), b"q": (200, "no/True")}
