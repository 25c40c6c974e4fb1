"""The model-archiver command: TorchServe's flags, one error line, exit status 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import read_manifest
from archiver.cli import main


@pytest.fixture
def src(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "handler.py").write_text("def handle(data, context):\n    return data\n")
    (src / "model.pt").write_bytes(b"weights")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(src)
    return src


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


BASE = ("--model-name", "m", "--handler", "handler.py", "--serialized-file", "model.pt")


@pytest.mark.parametrize(
    ("archive_format", "name"),
    [("default", "m.mar"), ("zip-store", "m.mar"), ("tgz", "m.tar.gz"), ("no-archive", "m")],
)
def test_cli_writes_each_format_silently(
    src: Path, tmp_path: Path, archive_format: str, name: str
) -> None:
    code, out, err = _invoke(*BASE, "--export-path", "../out", "--archive-format", archive_format)
    assert (code, out, err) == (0, "", "")
    manifest = read_manifest(tmp_path / "out" / name)
    assert (manifest.model_name, manifest.model_version, manifest.handler) == (
        "m",
        "1.0",
        "handler.py",
    )


def test_cli_accepts_torchserve_short_flags(src: Path, tmp_path: Path) -> None:
    (src / "req.txt").write_text("numpy\n")
    (src / "cfg.yaml").write_text("batchSize: 2\n")
    code, _, err = _invoke(
        *BASE,
        "-v",
        "2.0",
        "-r",
        "req.txt",
        "-c",
        "cfg.yaml",
        "--export-path",
        "../out",
        "--runtime",
        "python",
    )
    assert (code, err) == (0, "")
    manifest = read_manifest(tmp_path / "out" / "m.mar")
    assert (manifest.model_version, manifest.requirements_file, manifest.config_file) == (
        "2.0",
        "req.txt",
        "cfg.yaml",
    )


def test_cli_reports_missing_file_with_exit_1(src: Path, tmp_path: Path) -> None:
    code, out, err = _invoke(
        "--model-name",
        "m",
        "--handler",
        "handler.py",
        "--serialized-file",
        "gone.pt",
        "--export-path",
        "../out",
    )
    assert (code, out) == (1, "")
    assert err == (
        "model-archiver: error: File 'gone.pt' given as --serialized-file not found:"
        " check the path.\n"
    )
    assert list((tmp_path / "out").iterdir()) == []


def test_cli_reports_invalid_model_name_with_exit_1(src: Path, tmp_path: Path) -> None:
    code, _, err = _invoke(
        "--model-name", "bad name", "--handler", "handler.py", "--export-path", "../out"
    )
    assert code == 1
    assert err.startswith("model-archiver: error: Invalid model name 'bad name': it must match")
    assert list((tmp_path / "out").iterdir()) == []


def test_cli_reports_missing_export_path_with_exit_1(src: Path, tmp_path: Path) -> None:
    code, _, err = _invoke(*BASE, "--export-path", "../nowhere")
    assert code == 1
    assert err == (
        "model-archiver: error: Export path '../nowhere' is not a directory: create it first"
        " or pass an existing --export-path.\n"
    )
    assert not (tmp_path / "nowhere").exists()


def test_cli_refuses_existing_output_unless_forced(src: Path, tmp_path: Path) -> None:
    assert _invoke(*BASE, "--export-path", "../out")[0] == 0
    code, _, err = _invoke(*BASE, "--export-path", "../out", "-v", "2.0")
    assert code == 1
    assert err == (
        "model-archiver: error: Output '../out/m.mar' already exists:"
        " pass --force (force=True) to overwrite it.\n"
    )
    assert read_manifest(tmp_path / "out" / "m.mar").model_version == "1.0"
    assert _invoke(*BASE, "--export-path", "../out", "-v", "2.0", "-f")[0] == 0
    assert read_manifest(tmp_path / "out" / "m.mar").model_version == "2.0"
    assert _invoke(*BASE, "--export-path", "../out", "-v", "3.0", "--force")[0] == 0
    assert read_manifest(tmp_path / "out" / "m.mar").model_version == "3.0"


@pytest.mark.parametrize(
    ("args", "wording"),
    [
        (("--handler", "h"), "Missing option '--model-name'"),
        (("--model-name", "m"), "Missing option '--handler'"),
        ((*BASE, "--archive-format", "rar"), "Invalid value for '--archive-format'"),
        ((*BASE, "--runtime", "LSP"), "Invalid value for '--runtime'"),
    ],
)
def test_cli_usage_errors_exit_2(src: Path, args: tuple[str, ...], wording: str) -> None:
    code, _, err = _invoke(*args)
    assert code == 2
    assert wording in err


def test_cli_console_script_runs(src: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("model-archiver")
    if not script.exists():
        pytest.skip("model-archiver console script is not installed in this environment")
    ok = subprocess.run(
        [script, *BASE, "--export-path", "../out"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (ok.returncode, ok.stderr) == (0, "")
    again = subprocess.run(
        [script, *BASE, "--export-path", "../out"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1
    assert again.stderr.startswith("model-archiver: error: Output '../out/m.mar' already exists")
