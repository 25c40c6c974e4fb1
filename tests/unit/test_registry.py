"""Registry lookups, defaults and removal, with the wording clients see."""

from __future__ import annotations

from pathlib import Path

import pytest

from mservd.config import Settings, resolve_model_settings
from mservd.controller import snapshot
from mservd.core.registry import ModelVersion, Registry
from mservd.errors import Forbidden, ModelNotFound


def version(name: str, v: str, **api) -> ModelVersion:
    settings = resolve_model_settings(Settings(), name, v, api=api or None)
    return ModelVersion(name=name, version=v, url=f"{name}.mar", model_dir=Path("/nowhere"),
                        manifest={"model": {"handler": "h.py"}}, settings=settings, model_yaml={})


def test_registry_first_version_is_the_default_until_set() -> None:
    r = Registry()
    r.add(version("m", "1.0"))
    r.add(version("m", "10.0"))
    r.add(version("m", "2.0"))
    assert r.get("m").version == "1.0"
    assert [mv.version for mv in r.versions("m")] == ["1.0", "2.0", "10.0"]
    r.set_default("m", "2.0")
    assert r.get("m").version == "2.0"


def test_registry_lookup_errors_name_the_model_and_version() -> None:
    r = Registry()
    r.add(version("m", "1.0"))
    with pytest.raises(ModelNotFound, match="^Model not found: x$"):
        r.get("x")
    with pytest.raises(ModelNotFound, match="^Model version: 3 does not exist for model: m$"):
        r.get("m", "3")


def test_registry_removes_the_default_only_when_it_is_the_last() -> None:
    r = Registry()
    r.add(version("m", "1.0"))
    r.add(version("m", "2.0"))
    with pytest.raises(Forbidden, match="Cannot remove default version 1.0"):
        r.remove("m", "1.0")
    r.remove("m", "2.0")
    r.remove("m", None)
    assert r.names() == []


def test_snapshot_round_trips_and_skips_a_corrupt_newer_one(tmp_path: Path) -> None:
    r = Registry()
    r.add(version("m", "1.0", batch_size=4, initial_workers=2))
    r.add(version("m", "2.0"))
    r.set_default("m", "2.0")
    snapshot.write(tmp_path, snapshot.capture(r))
    (snapshot.folder(tmp_path) / "99999999999999999999-snapshot.json").write_text("{")
    restore = snapshot.load_latest(tmp_path)
    assert len(restore.problems) == 1 and "unreadable" in restore.problems[0]
    assert restore.defaults == {"m": "2.0"}
    first = next(a for a in restore.registrations if a["url"] == "m.mar" and a["batch_size"] == 4)
    assert (first["min_worker"], first["max_worker"]) == (2, 2)


def test_snapshot_keeps_only_the_newest_files(tmp_path: Path) -> None:
    for _ in range(snapshot.KEEP + 3):
        snapshot.write(tmp_path, {"models": {}})
    assert len(list(snapshot.folder(tmp_path).glob("*-snapshot.json"))) == snapshot.KEEP


def test_the_largest_batch_advised_under_auto_is_the_live_workers_share_of_what_it_held() -> None:
    from mservd.core.advisor import LARGEST_BATCH
    from mservd.core.worker_handle import WorkerHandle, WorkerState

    fixed, auto = version("m", "1.0", batch_size=8), version("a", "1.0", batch_size="auto")
    for mv in (fixed, auto):
        for i in range(2):
            worker = WorkerHandle(str(9000 + i), mv.name, "1.0", proc=None, gpu_id=None, mv=mv)
            worker.state = WorkerState.SERVING
            mv.workers[worker.id] = worker
        mv.held.extend([10, 45, 30])
    assert fixed.largest_batch() == LARGEST_BATCH  # a set batch size: the advice is per worker
    assert auto.largest_batch() == 23  # 45 held at most, two workers: 23 each, rounded up
