"""The frontends' parts against strangers and faults (issue 45), without a daemon: lanes of
questions anyone may ask, dashboard sessions in the key store, the bridge losing its
controller, and run folders of daemons that are gone."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from mservd import protocol
from mservd.auth import LOGOUT, MANAGEMENT, SESSION, SESSION_HOURS, SESSION_PREFIX, KeyStore
from mservd.controller.daemon import (
    RUN_OWNER,
    make_run_folder,
    process_start,
    remove_orphan_run_folders,
)
from mservd.errors import Unauthorized
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.bridge import ControllerGone, client_network
from mservd.frontends.spaced import SpacedQuestions, TooManyQuestions

# -- lanes ---------------------------------------------------------------------------------


class Controller:
    """Answers each question after ``seconds``, noting the order they were asked in."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.asked: list[object] = []

    async def ask(self, key) -> str:
        self.asked.append(key)
        await asyncio.sleep(self.seconds)
        return f"answer to {key}"


def test_a_health_check_waits_for_one_question_of_each_lane_not_behind_a_flood() -> None:
    async def flood_then_ping() -> tuple[list[object], str]:
        controller = Controller(0.001)
        questions = SpacedQuestions(controller.ask, "questions")
        loop = asyncio.get_running_loop()
        strangers = [loop.create_task(questions.answer(("token", n), "tokens", f"10.0.0.{n}"))
                     for n in range(60)]
        await asyncio.sleep(0)
        ping = await questions.answer(("ping",), "health")
        for task in strangers:
            task.cancel()
        return controller.asked, ping

    asked, ping = asyncio.run(flood_then_ping())
    assert ping == "answer to ('ping',)"
    assert asked.index(("ping",)) <= 2  # after the token under way and at most one more


def test_one_client_may_have_only_its_own_few_questions_waiting_in_a_bounded_lane() -> None:
    async def one_address() -> None:
        questions = SpacedQuestions(Controller(0.01).ask, "questions", per_client={"tokens": 3})
        loop = asyncio.get_running_loop()
        waiting = [loop.create_task(questions.answer(("token", n), "tokens", "10.0.0.1"))
                   for n in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(TooManyQuestions, match="3 tokens questions from 10.0.0.1"):
            await questions.answer(("token", "one more"), "tokens", "10.0.0.1")
        # another address, and a question of no known client, are still taken
        assert await questions.answer(("token", "other"), "tokens", "10.0.0.2")
        assert await questions.answer(("token", "anyone"), "tokens", None)
        await asyncio.gather(*waiting)

    asyncio.run(one_address())


def test_clients_within_a_lane_take_turns() -> None:
    async def two_addresses() -> list[object]:
        controller = Controller(0.0)
        questions = SpacedQuestions(controller.ask, "questions")
        loop = asyncio.get_running_loop()
        asked = [loop.create_task(questions.answer(("t", client, n), "tokens", client))
                 for client in ("a", "b") for n in range(3)]
        await asyncio.gather(*asked)
        return controller.asked

    assert [key[1] for key in asyncio.run(two_addresses())] == ["a", "b", "a", "b", "a", "b"]


def test_a_client_counts_by_its_address_an_ipv6_one_by_its_64() -> None:
    assert client_network("127.0.0.2") == "127.0.0.2"
    assert client_network("::ffff:10.1.2.3") == "10.1.2.3"
    assert client_network("2001:db8::1") == client_network("2001:db8::ffff") == "2001:db8::/64"
    assert client_network("-") is None and client_network(None) is None


# -- dashboard sessions --------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_dashboard_session_is_random_expires_and_ends_at_logout_or_rotation(tmp_path) -> None:
    clock = Clock()
    keys = KeyStore(tmp_path / "key_file.json", 24 * 60, clock)
    key = keys.keys[MANAGEMENT]
    with pytest.raises(Unauthorized):
        keys.rotate("not the key", SESSION)
    first, second = keys.rotate(key, SESSION), keys.rotate(key, SESSION)
    assert first.startswith(SESSION_PREFIX) and first != second and key not in first
    keys.check(MANAGEMENT, first)
    with pytest.raises(Unauthorized):  # a session opens no session: only the key does
        keys.rotate(first, SESSION)
    assert first not in (tmp_path / "key_file.json").read_text()  # never written down
    keys.rotate(first, LOGOUT)
    with pytest.raises(Unauthorized, match="session has ended"):
        keys.check(MANAGEMENT, first)
    keys.check(MANAGEMENT, second)
    clock.now += SESSION_HOURS * 3600 + 1
    with pytest.raises(Unauthorized, match="session has ended"):
        keys.check(MANAGEMENT, second)
    third = keys.rotate(key, SESSION)
    keys.rotate(keys.keys["API"], MANAGEMENT)
    with pytest.raises(Unauthorized, match="session has ended"):
        keys.check(MANAGEMENT, third)


def test_a_session_never_outlives_the_management_key(tmp_path) -> None:
    clock = Clock()
    keys = KeyStore(tmp_path / "key_file.json", 10, clock)  # the key lives 10 minutes
    session = keys.rotate(keys.keys[MANAGEMENT], SESSION)
    clock.now += 11 * 60
    with pytest.raises(Unauthorized):
        keys.check(MANAGEMENT, session)


# -- losing the controller ------------------------------------------------------------------


def test_a_bridge_that_loses_its_controller_answers_every_waiting_call_503_and_says_so(
        tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/frontend.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    lost: list[bool] = []

    async def main() -> tuple[protocol.Reply, list[bytes], protocol.Reply]:
        bridge = AsyncBridge(endpoint, on_lost=lambda: lost.append(True))
        try:
            plain = asyncio.ensure_future(bridge.call(b"plain", request(b"plain"), 30.0))
            streamed = asyncio.ensure_future(bridge.call(b"s", request(b"s"), 30.0,
                                                         stream=True))
            while len(received := drain(router)) < 1:
                await asyncio.sleep(0.01)
            fid = received[0][0]
            router.send_multipart([fid, *protocol.chunks(
                [protocol.Result(b"s", protocol.head(200), b"part one")])])
            first = await asyncio.wait_for(streamed, 10)
            router.close()  # the controller dies
            parts = [part async for part in first.stream]
            answer = await asyncio.wait_for(plain, 10)
            with pytest.raises(ControllerGone):
                await bridge.call(b"later", request(b"later"), 30.0)
            return answer, parts, first
        finally:
            bridge.close()

    try:
        answer, parts, first = asyncio.run(main())
    finally:
        ctx.term()
    assert answer.status == 503 and b"controller" in answer.body
    assert len(parts) == 1 and json.loads(parts[0])["code"] == 503
    assert first.final_status == 503 and lost == [True]


def request(rid: bytes) -> list[bytes]:
    return protocol.prediction(rid, "m", None, None, protocol.CODEC_TORCHSERVE,
                               [("body", "text/plain")], {}, [b"payload"])


def drain(router: zmq.Socket, seen: list | None = None) -> list[list[bytes]]:
    seen = [] if seen is None else seen
    while router.poll(0):
        seen.append(router.recv_multipart())
    return seen


# -- run folders -----------------------------------------------------------------------------


def stamped(folder: Path, pid: int, started: int | None) -> Path:
    folder.mkdir()
    (folder / RUN_OWNER).write_text(json.dumps({"pid": pid, "started": started}))
    (folder / "models").mkdir()
    (folder / "models" / "unpacked.bin").write_bytes(b"x" * 1000)
    return folder


def test_a_start_removes_only_the_run_folders_of_daemons_that_are_gone(tmp_path,
                                                                       monkeypatch) -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        alive = stamped(tmp_path / "mservd-alive", live.pid, process_start(live.pid))
        gone = stamped(tmp_path / "mservd-gone", dead.pid, 12345)
        reused = stamped(tmp_path / "mservd-reused", live.pid, 1)  # its pid, not its start
        unstamped = tmp_path / "mservd-unstamped"
        unstamped.mkdir()
        other = stamped(tmp_path / "other-gone", dead.pid, 12345)  # not named as ours
        removed = remove_orphan_run_folders(tmp_path)
    finally:
        live.kill()
        live.wait()
    assert sorted(removed) == sorted([gone, reused])
    assert alive.exists() and unstamped.exists() and other.exists()
    assert not gone.exists() and not reused.exists()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    own = make_run_folder()
    try:
        assert json.loads((own / RUN_OWNER).read_text())["pid"] == os.getpid()
        assert own not in remove_orphan_run_folders(tmp_path)  # this process's own: kept
    finally:
        import shutil

        shutil.rmtree(own)
