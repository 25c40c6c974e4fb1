"""One step of a continuous-batching worker: the parts of the step leave as one CHUNK, before
the DONE of the requests that finished in it."""

from __future__ import annotations

from handlers.context import Context
from mservd import protocol
from mservd.worker import codecs
from mservd.worker.continuous import SequenceTable, step


class Outbox:
    """Stands in for the worker's ZeroMQ socket: keeps what would be sent."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(list(frames))


class Countdown:
    """Each request's body is how many steps it runs; a finished request answers "done"."""

    def handle(self, rows, context):
        left = [int(row["body"]) - context.cache.get(rid, 0)
                for row, rid in zip(rows, context.request_ids.values())]
        for rid in context.request_ids.values():
            context.cache[rid] = context.cache.get(rid, 0) + 1
        context.stopping_criteria = [lambda out, n=n: n <= 1 for n in left]
        return [f"left {n - 1}" if n > 1 else "done" for n in left]


def test_continuous_step_sends_its_parts_in_one_chunk_before_the_answers_it_finished() -> None:
    context = Context("m", ".", {"model": {"modelVersion": "1.0"}}, 8, None, "mservd")
    context.cache = {}
    running = SequenceTable()
    requests = [protocol.Request(rid, protocol.CODEC_TORCHSERVE, [("body", "text/plain")], {},
                                 [steps]) for rid, steps in ((b"a", b"1"), (b"b", b"3"),
                                                             (b"c", b"2"))]
    decoded, refused = codecs.decode(requests, context)
    assert refused == []
    for request, codec, call in decoded:
        running.join(request, codec, call)
    sock = Outbox()
    step(sock, Countdown(), context, running, 1 << 20)
    assert [frames[0] for frames in sock.sent] == [protocol.CHUNK, protocol.DONE]
    parts = protocol.parse_results(sock.sent[0][1:])
    assert [(p.rid, p.body) for p in parts] == [(b"b", b"left 2"), (b"c", b"left 1")]
    [finished] = protocol.parse_results(sock.sent[1][1:])
    assert (finished.rid, finished.body) == (b"a", b"done")
    assert list(running.requests) == [b"b", b"c"]  # "a" left; the others run on


class AnswersAtOnceOrStreams:
    """TorchServe's stopping criteria: None for a request answered in one step (TorchServe sends
    no ``ts_stream_next`` then: it is finished), False for a stream that runs on."""

    def handle(self, rows, context):
        context.stopping_criteria = [
            (lambda out: None) if row["body"] == "once" else (lambda out: False)
            for row in rows]
        return ["answer" for _ in rows]


def one_step(handler, bodies: dict[bytes, bytes]) -> tuple[Outbox, SequenceTable]:
    """Run one step of ``handler`` with a request per ``rid: body``: what it sent, what runs on."""
    context = Context("m", ".", {"model": {"modelVersion": "1.0"}}, 8, None, "mservd")
    running = SequenceTable()
    requests = [protocol.Request(rid, protocol.CODEC_TORCHSERVE, [("body", "text/plain")], {},
                                 [body]) for rid, body in bodies.items()]
    decoded, _ = codecs.decode(requests, context)
    for request, codec, call in decoded:
        running.join(request, codec, call)
    sock = Outbox()
    step(sock, handler, context, running, 1 << 20)
    return sock, running


def test_a_stopping_criterion_of_none_finishes_its_request_as_in_torchserve() -> None:
    sock, running = one_step(AnswersAtOnceOrStreams(), {b"a": b"once", b"b": b"stream"})
    [finished] = protocol.parse_results(sock.sent[-1][1:])
    assert sock.sent[-1][0] == protocol.DONE and finished.rid == b"a"
    assert list(running.requests) == [b"b"]


class CriterionFails:
    """A stopping criterion that raises for one request (a handler's bug)."""

    def handle(self, rows, context):
        def broken(out):
            raise KeyError("state already cleaned up")

        context.stopping_criteria = [
            broken if row["body"] == "broken" else (lambda out: True) for row in rows]
        return ["answer" for _ in rows]


def test_a_stopping_criterion_that_raises_fails_its_request_not_the_worker() -> None:
    sock, running = one_step(CriterionFails(), {b"a": b"broken", b"b": b"fine"})  # it returns
    answers = {r.rid: r for r in protocol.parse_results(sock.sent[-1][1:])}
    assert protocol.Head.parse(answers[b"a"].head).status == 500
    assert b"stopping criterion failed" in answers[b"a"].body
    assert answers[b"b"].body == b"answer" and running.requests == {}
