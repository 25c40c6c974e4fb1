"""Log rotation: copied aside and emptied in place, so writers holding the file keep writing."""

from __future__ import annotations

from pathlib import Path

from mservd.controller.log_rotation import LogRotation, rotate_full_logs


def test_a_full_log_is_copied_aside_and_emptied_while_its_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "access_log.log"
    with open(path, "ab", buffering=0) as writer:  # as a frontend or a worker holds it
        writer.write(b"old line\n" * 20)
        assert rotate_full_logs(tmp_path, max_bytes=100, backups=3) == ["access_log.log"]
        writer.write(b"new line\n")
    assert (tmp_path / "access_log.log.1").read_bytes() == b"old line\n" * 20
    assert path.read_bytes() == b"new line\n"  # at the start, no hole before it


def test_rotation_keeps_backup_count_copies_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "mservd.log"
    for generation in range(4):
        path.write_bytes(f"generation {generation}\n".encode() * 10)
        rotate_full_logs(tmp_path, max_bytes=10, backups=2)
    assert (tmp_path / "mservd.log.1").read_bytes().startswith(b"generation 3")
    assert (tmp_path / "mservd.log.2").read_bytes().startswith(b"generation 2")
    assert not (tmp_path / "mservd.log.3").exists()
    rotate_full_logs(tmp_path, max_bytes=10, backups=0)  # nothing to rotate: it is empty
    path.write_bytes(b"x" * 20)
    rotate_full_logs(tmp_path, max_bytes=10, backups=0)
    assert path.read_bytes() == b"" and (tmp_path / "mservd.log.1").read_bytes() != b"x" * 20


def test_only_logs_over_the_limit_in_the_folder_itself_are_rotated(tmp_path: Path) -> None:
    (tmp_path / "small.log").write_bytes(b"x" * 10)
    (tmp_path / "mservd.out").write_bytes(b"x" * 200)
    (tmp_path / "mservd.state.json").write_bytes(b"x" * 200)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "snapshot.log").write_bytes(b"x" * 200)
    outside = tmp_path / "elsewhere.txt"
    outside.write_bytes(b"x" * 200)
    (tmp_path / "linked.log").symlink_to(outside)
    assert rotate_full_logs(tmp_path, max_bytes=100, backups=1) == ["mservd.out"]
    assert outside.read_bytes() == b"x" * 200
    assert (tmp_path / "config" / "snapshot.log").stat().st_size == 200


def test_log_max_bytes_zero_starts_no_thread(tmp_path: Path) -> None:
    rotation = LogRotation(tmp_path, max_bytes=0, backups=5)
    rotation.start()
    assert not rotation._thread.is_alive()
    rotation.stop()
