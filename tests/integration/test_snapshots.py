"""The registry survives a restart, even after SIGKILL, unless --ncs; bad snapshots are skipped."""

from __future__ import annotations

import signal

import psutil
from conftest import Daemon


def summary(daemon: Daemon) -> dict:
    out = {}
    for entry in daemon.manage("GET", "/models").json()["models"]:
        for mv in daemon.describe(entry["modelName"], "all"):
            out[(mv["modelName"], mv["modelVersion"])] = (
                mv["isDefault"], mv["minWorkers"], mv["maxWorkers"], len(mv["workers"]),
                mv["batchSize"], mv["maxBatchDelay"], mv["responseTimeout"])
    return out


def kill(daemon: Daemon) -> None:
    children = daemon.descendants()
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait()
    psutil.wait_procs(children, timeout=30)


def test_registry_is_restored_after_sigkill_and_skips_a_corrupt_snapshot(tmp_path, store) -> None:
    daemon = Daemon(tmp_path, store, args=("--enable-model-api",)).start()
    try:
        for params in ({"url": "echo.mar", "batch_size": 4, "max_batch_delay": 30,
                        "initial_workers": 2, "response_timeout": 33},
                       {"url": "echo-2.0.mar", "initial_workers": 1},
                       {"url": "tiny.mar", "initial_workers": 0}):
            assert daemon.manage("POST", "/models", params=params).status_code == 200
        assert daemon.manage("PUT", "/models/echo/2.0/set-default").status_code == 200
        assert daemon.manage("PUT", "/models/tiny", params={"min_worker": 1, "max_worker": 3,
                                                            "synchronous": "true"}).status_code == 200
        before = summary(daemon)
        assert before[("echo", "2.0")][0] is True
    finally:
        kill(daemon)
    snapshots = sorted((tmp_path / "logs" / "config").glob("*-snapshot.json"))
    assert snapshots

    again = Daemon(tmp_path, store, args=("--enable-model-api",)).start()
    try:
        assert summary(again) == before
        assert again.state["warnings"] == []
        assert again.predict("echo", json={"x": 1}).json()["version"] == "2.0"
    finally:
        again.stop()

    newest = max((tmp_path / "logs" / "config").glob("*-snapshot.json"))
    (newest.parent / "99999999999999999999-snapshot.json").write_text('{"models": {"echo": ')
    third = Daemon(tmp_path, store, args=("--enable-model-api",)).start()
    try:
        assert summary(third) == before
        assert len(third.state["warnings"]) == 1
        assert "99999999999999999999-snapshot.json is unreadable" in third.state["warnings"][0]
    finally:
        third.stop()


def test_ncs_starts_without_the_snapshot(tmp_path, store) -> None:
    daemon = Daemon(tmp_path, store, args=("--enable-model-api",)).start()
    try:
        assert daemon.manage("POST", "/models", params={"url": "echo.mar"}).status_code == 200
    finally:
        daemon.stop()
    fresh = Daemon(tmp_path, store, args=("--enable-model-api", "--ncs")).start()
    try:
        assert fresh.manage("GET", "/models").json() == {"models": []}
    finally:
        fresh.stop()
