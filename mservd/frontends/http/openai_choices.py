"""Several choices of one OpenAI request (``n`` > 1, or a list of prompts), each its own
request to the worker, merged into one answer.

Each choice travels as a request of its own (``OpenAIRequest.choices``), so the generation
engine batches them like any others and its prefix cache shares the prompt's KV blocks among
the choices of one prompt; they carry one group key, so a model whose versions share its
traffic serves them all from one version (``protocol.group_key``). Their answers become one:
a whole answer lists the choices, each with its ``index``; a streamed one interleaves their
chunks as they come, each carrying its own ``index`` and the first choice's ``id``, and ends
with one usage chunk (when asked) and one ``data: [DONE]``. Usage counts each prompt's tokens once (as OpenAI's does: the choices of a
prompt share it) and every choice's completion tokens. The first choice that fails fails the
request: the others are cancelled (their slots freed) and its error is the answer.

Not for one choice: that request is forwarded alone, and its answer relayed as it is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from mservd.frontends.http.request import Answer, HttpRequest
from mservd.openai_request import OpenAIRequest

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
DONE = b"data: [DONE]\n\n"

#: one choice's request forwarded to its worker: its answer (a stream's first part)
Forward = Callable[[HttpRequest, OpenAIRequest], Awaitable[Answer]]


class Again(HttpRequest):
    """The request once more, for one more choice: its body was read and checked already,
    and a hang-up of the client cancels every choice."""

    __slots__ = ("hang_ups",)

    def __init__(self, request: HttpRequest, hang_ups: list[Callable[[], None]]) -> None:
        for name in HttpRequest.__slots__:
            setattr(self, name, getattr(request, name))
        self.bodies, self.held, self.connection = None, 0, None  # the request holds its body
        self.hang_ups = hang_ups

    async def body(self, limit: int, seconds: float) -> bytes:
        return b""

    def on_hang_up(self, callback: Callable[[], None] | None) -> None:
        if callback is not None:
            self.hang_ups.append(callback)


async def fan_out(request: HttpRequest, choices: list[OpenAIRequest], n: int,
                  forward: Forward) -> Answer:
    """Every choice forwarded at once, their answers merged; ``n`` choices per prompt. A
    streamed request's choices each stream their usage, which is summed here and sent once
    if the client asked for it."""
    stream, include_usage = choices[0].stream, choices[0].include_usage
    for choice in choices:
        choice.include_usage = stream
    hang_ups: list[Callable[[], None]] = []

    def hung_up() -> None:
        for cancel in hang_ups:
            cancel()

    request.on_hang_up(hung_up)
    results = await asyncio.gather(*(forward(Again(request, hang_ups), choice)
                                     for choice in choices), return_exceptions=True)
    answers = [r for r in results if isinstance(r, Answer)]
    failed = next((r for r in results if not isinstance(r, Answer)), None)
    refused = next((a for a in answers if a.status != 200), None)
    if failed is not None or refused is not None:
        for answer in answers:
            await close(answer)
        if failed is not None:
            raise failed
        assert refused is not None
        return refused
    first = answers[0]
    if not stream:
        return Answer(200, merged_whole([a.body for a in answers], n), first.content_type,
                      first.headers, rid=first.rid)
    return Answer(200, b"", first.content_type, first.headers,
                  merged_stream(answers, n, include_usage), first.rid)


async def close(answer: Answer) -> None:
    """A choice's answer nobody reads: a stream left open is cancelled (``aclose``)."""
    stream = answer.stream
    if stream is not None and hasattr(stream, "aclose"):
        await stream.aclose()


def merged_whole(bodies: list[bytes], n: int) -> bytes:
    """One whole answer of each choice's: the choices in order, the usage summed."""
    docs = [json.loads(body) for body in bodies]
    merged: dict[str, Any] = {**docs[0], "choices": []}
    usage = dict.fromkeys(USAGE_KEYS, 0)
    for index, doc in enumerate(docs):
        for choice in doc["choices"]:
            merged["choices"].append({**choice, "index": index})
        count(usage, doc.get("usage"), first_of_prompt=index % n == 0)
    merged["usage"] = usage
    return json.dumps(merged).encode()


def count(usage: dict[str, int], more: Any, first_of_prompt: bool) -> None:
    """Add a choice's usage: its completion tokens always, its prompt's once per prompt."""
    if not isinstance(more, dict):
        return
    prompt = int(more.get("prompt_tokens") or 0) if first_of_prompt else 0
    completion = int(more.get("completion_tokens") or 0)
    usage["prompt_tokens"] += prompt
    usage["completion_tokens"] += completion
    usage["total_tokens"] += prompt + completion


async def merged_stream(answers: list[Answer], n: int,
                        include_usage: bool) -> AsyncIterator[bytes]:
    """The choices' events as they come, each choice's chunks re-indexed, then one usage
    chunk (when asked) and one ``[DONE]``."""
    parts: asyncio.Queue[tuple[int, bytes | None]] = asyncio.Queue()

    async def pump(index: int, answer: Answer) -> None:
        try:
            if answer.body:
                parts.put_nowait((index, answer.body))
            if answer.stream is not None:  # None: the whole answer came as one part
                async for part in answer.stream:
                    parts.put_nowait((index, part))
        finally:
            parts.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, a)) for i, a in enumerate(answers)]
    usage = dict.fromkeys(USAGE_KEYS, 0)
    envelope: dict[str, Any] = {}
    running = len(answers)
    try:
        while running:
            index, part = await parts.get()
            if part is None:
                running -= 1
                continue
            out = b"".join(rewritten(index, part, n, include_usage, usage, envelope))
            if out:
                yield out
        if include_usage and envelope:
            yield b"data: " + json.dumps({**envelope, "choices": [], "usage": usage}).encode() \
                + b"\n\n"
        yield DONE
    finally:
        for task in tasks:
            task.cancel()
        for answer in answers:
            await close(answer)


def rewritten(index: int, part: bytes, n: int, include_usage: bool, usage: dict[str, int],
              envelope: dict[str, Any]) -> list[bytes]:
    """One choice's part as the merged stream sends it: each chunk with the choice's
    ``index`` and the first chunk's ``id``, ``created`` and ``model``; its usage counted (not
    sent), its ``[DONE]`` dropped; an error event as it is."""
    out = []
    for event in part.split(b"\n\n"):
        if not event.startswith(b"data: ") or event == DONE.rstrip():
            continue
        doc = json.loads(event[6:])
        if "choices" not in doc:  # an error event: the stream as_events ended
            out.append(event + b"\n\n")
            continue
        if not envelope:
            envelope.update({k: doc[k] for k in ("id", "object", "created", "model")
                             if k in doc})
        if not doc["choices"]:  # the choice's usage chunk
            count(usage, doc.get("usage"), first_of_prompt=index % n == 0)
            continue
        doc.update(envelope)
        doc["choices"] = [{**choice, "index": index} for choice in doc["choices"]]
        if not include_usage:
            doc.pop("usage", None)
        out.append(b"data: " + json.dumps(doc).encode() + b"\n\n")
    return out
