"""Faults and hostile clients of the generation and stateful paths, against the real daemon with
token auth on (issue 45): a stream whose worker dies ends with an error and is never replayed
from its start; a generation longer than ``responseTimeout`` is not taken for a hung worker;
a stateful model's sequence is its opener's alone, and one client cannot fill maxNumSequence.

``steady`` is ``tests/fixtures/handlers/steady_steps.py``: a continuous-batching handler that
gives every running request one token (``<pid>:<n> ``) per 0.2 s step, so that each token says
which worker made it and where it is in its generation. ``seqsum`` is
``tests/fixtures/handlers/stateful_sum.py``: each sequence's running sum in its worker. Two
clients are told apart by their addresses: 127.0.0.1 and 127.0.0.2 (both loopback)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from urllib.parse import urlsplit

import pytest
import requests

MODEL = "steady"
STEP_SECONDS = 0.2  # the handler's
# seconds: long enough that a loaded CI minute's pause does not pass for a hung step; a
# generation of 40 tokens takes more than twice as long
RESPONSE_TIMEOUT = 3
STATEFUL = "seqsum"
SEQ_ID = "ts_request_sequence_id"
SEQ_START = "ts_request_sequence_start"
SEQ_END = "ts_request_sequence_end"
ME, OTHER = "127.0.0.1", "127.0.0.2"
# A sequence is bound to the client address its frontend puts in the request's route


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    from conftest import Daemon, write_archive

    store = tmp_path_factory.mktemp("faults-store")  # its own: no sample is built for it
    write_archive(store, MODEL, "steady_steps.py",
                  config={"continuousBatching": True, "minWorkers": 2, "maxWorkers": 2,
                          "batchSize": 8, "responseTimeout": RESPONSE_TIMEOUT})
    write_archive(store, STATEFUL, "stateful_sum.py",
                  config={"sequenceBatching": True, "minWorkers": 1, "maxWorkers": 1,
                          "batchSize": 1, "maxNumSequence": 4, "sequenceMaxIdleMSec": 60000})
    daemon = Daemon(tmp_path_factory.mktemp("faults"), store,
                    {"load_models": f"{MODEL}.mar,{STATEFUL}.mar"})
    daemon.start()
    assert daemon.key("inference"), "token authorization must be on for these tests"
    yield daemon
    daemon.stop()


def both_workers_ready(daemon) -> set[int]:
    from conftest import wait_until

    wait_until(lambda: [w["status"] for w in daemon.describe(MODEL)[0]["workers"]]
               == ["READY", "READY"], 60, "both workers to be ready", details=daemon.logs)
    return daemon.worker_pids(MODEL)


def generate(daemon, route: str, prompt: str, max_tokens: int, **kwargs) -> requests.Response:
    return requests.post(daemon.url("inference", f"/v2/models/{MODEL}/{route}"),
                         json={"text_input": prompt, "parameters": {"max_tokens": max_tokens}},
                         headers=daemon._headers("inference", None), **kwargs)


def tokens(text: str) -> list[tuple[int, int]]:
    """The (pid, n) of each token of a text the handler made."""
    return [tuple(int(x) for x in token.split(":")) for token in text.split()]


class Stream:
    """A ``generate_stream`` read on a thread of its own: its events, as they come."""

    def __init__(self, daemon, max_tokens: int) -> None:
        self.events: list[dict | str] = []
        self.status: int | None = None
        self.thread = threading.Thread(target=self._read, args=(daemon, max_tokens), daemon=True)
        self.thread.start()

    def _read(self, daemon, max_tokens: int) -> None:
        with generate(daemon, "generate_stream", "go", max_tokens, stream=True,
                      timeout=60) as answer:
            self.status = answer.status_code
            for line in answer.iter_lines():
                if line.startswith(b"data: "):
                    data = line[len(b"data: "):]
                    self.events.append("[DONE]" if data == b"[DONE]" else json.loads(data))

    def tokens(self) -> list[tuple[int, int]]:
        return [t for e in self.events if isinstance(e, dict) and "text_output" in e
                for t in tokens(e["text_output"])]


def test_a_stream_whose_worker_dies_ends_with_an_error_and_only_unsent_requests_move(
        daemon) -> None:
    from conftest import wait_until

    pids = both_workers_ready(daemon)
    streams = [Stream(daemon, max_tokens=60) for _ in range(4)]
    quiet: dict[str, requests.Response] = {}  # a request that has sent its client nothing
    thread = threading.Thread(target=lambda: quiet.setdefault(
        "answer", generate(daemon, "generate", "go", 20, timeout=60)), daemon=True)
    thread.start()
    wait_until(lambda: all(len(s.tokens()) >= 2 for s in streams), 30,
               "every stream to have sent two tokens", details=daemon.logs)
    victim = streams[0].tokens()[0][0]
    assert victim in pids
    os.kill(victim, signal.SIGKILL)
    for stream in streams:
        stream.thread.join(60)
        assert not stream.thread.is_alive(), "a stream did not end after its worker died"
    thread.join(60)

    on_victim = [s for s in streams if s.tokens()[0][0] == victim]
    assert streams[0] in on_victim
    for stream in on_victim:
        seen = stream.tokens()
        assert stream.status == 200
        # every token came once, in order, from the worker that died: nothing replayed
        assert seen == [(victim, n) for n in range(1, len(seen) + 1)], seen
        assert len(seen) < 60
        *_, error, done = stream.events
        assert done == "[DONE]"
        assert "Worker died after this request had streamed part of its answer" in json.dumps(
            error), stream.events
    answer = quiet["answer"]
    assert answer.status_code == 200, answer.text  # it sent nothing: run again elsewhere
    made = tokens(answer.json()["text_output"])
    assert [n for _, n in made] == list(range(1, 21)) and len({p for p, _ in made}) == 1
    both_workers_ready(daemon)  # the dead one was replaced


def test_a_generation_longer_than_response_timeout_is_answered_and_its_worker_lives(
        daemon) -> None:
    pids = both_workers_ready(daemon)
    began = time.monotonic()
    answer = generate(daemon, "generate", "go", 40, timeout=90)  # not streamed: no parts
    took = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    made = tokens(answer.json()["text_output"])
    assert [n for _, n in made] == list(range(1, 41))
    assert took > 2 * RESPONSE_TIMEOUT  # it did outlast the step bound
    assert made[0][0] in pids and daemon.worker_pids(MODEL) == pids  # no worker was killed


def test_a_step_that_hangs_still_kills_its_worker_after_response_timeout(daemon) -> None:
    pids = both_workers_ready(daemon)
    answer = generate(daemon, "generate", "hang", 5, timeout=60)
    assert answer.status_code == 500, answer.text
    assert "Worker died" in answer.text
    assert both_workers_ready(daemon) != pids  # the hung one was replaced


def add(daemon, client: str, n: int, headers: dict[str, str] | None = None
        ) -> tuple[int, http.client.HTTPResponse, dict]:
    """``{"add": n}`` to the stateful model, sent from the address ``client``: the status,
    the answer (for its headers) and its JSON."""
    url = urlsplit(daemon.url("inference", f"/predictions/{STATEFUL}"))
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30,
                                      source_address=(client, 0))
    try:
        conn.request("POST", url.path, json.dumps({"add": n}),
                     {**daemon._headers("inference", headers),
                      "Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer, json.loads(answer.read())
    finally:
        conn.close()


def test_a_clients_own_sequence_start_header_never_reaches_the_handler(daemon) -> None:
    status, answer, body = add(daemon, ME, 5)
    assert status == 200 and body["start"] == "true"  # the server opened it
    sequence = answer.getheader(SEQ_ID)
    # a client's own start would tell a stateful handler to forget the sequence's state
    status, _, body = add(daemon, ME, 1, {SEQ_ID: sequence, SEQ_START: "true"})
    assert status == 200 and body["sum"] == 6
    assert body["start"] is None
    assert add(daemon, ME, 0, {SEQ_ID: sequence, SEQ_END: "true"})[0] == 200


def test_a_sequence_takes_requests_only_from_the_client_that_opened_it(daemon) -> None:
    status, _, body = add(daemon, ME, 1, {SEQ_ID: "mine"})
    assert status == 200 and body["sum"] == 1
    status, _, body = add(daemon, OTHER, 100, {SEQ_ID: "mine"})  # knows the id, and the key
    assert status == 403, body
    assert body["code"] == 403 and "was opened by another client" in body["message"]
    status, _, body = add(daemon, ME, 1, {SEQ_ID: "mine", SEQ_END: "true"})
    assert status == 200 and body["sum"] == 2  # untouched by the other client


def test_one_client_cannot_fill_max_num_sequence(daemon) -> None:
    opened = []
    for _ in range(2):  # requests naming no sequence: each opens one; 2 is half of 4
        status, answer, body = add(daemon, ME, 1)
        assert status == 200, body
        opened.append(answer.getheader(SEQ_ID))
    status, answer, body = add(daemon, ME, 1)
    assert status == 503, body
    assert "as many as one client may hold (max_sequences_per_client: 2)" in body["message"]
    status, answer, body = add(daemon, OTHER, 1)  # another client still gets one
    assert status == 200, body
    for sequence, client in [*((s, ME) for s in opened), (answer.getheader(SEQ_ID), OTHER)]:
        assert add(daemon, client, 0, {SEQ_ID: sequence, SEQ_END: "true"})[0] == 200
