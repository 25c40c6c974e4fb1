"""``mservd run-handler``: one batch through an archive's handler, outputs and phase timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image
from sample_archives import load_build_all

import archiver
from mservd.cli.run_handler import read_input, run_handler_command

REPO = Path(__file__).resolve().parents[2]
DIGIT_IMAGES = sorted((REPO / "samples" / "digits" / "images").glob("*.png"))
TINY_ROW = json.dumps([0.25] * 64)


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory):
    # Shared by name with test_samples.py: build_samples skips archives already built there.
    store = tmp_path_factory.getbasetemp() / "sample-archives"
    build_all = load_build_all()
    return lambda name: build_all.build_samples(store, [name])[name]


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(run_handler_command, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _handler_archive(tmp_path: Path, source: str) -> Path:
    handler = tmp_path / "broken_handler.py"
    handler.write_text(source)
    return archiver.write_archive(model_name="broken", handler=str(handler), export_path=tmp_path)


# --- inputs ------------------------------------------------------------------------------


def test_read_input_guesses_content_types(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("[1]")
    (tmp_path / "a.txt").write_text("hi")
    (tmp_path / "a.png").write_bytes(b"\x89PNG")
    assert read_input(str(tmp_path / "a.json")).content_type == "application/json"
    assert read_input(str(tmp_path / "a.txt")).content_type.startswith("text/plain")
    assert read_input(str(tmp_path / "a.png")).content_type == "image/png"
    assert read_input('{"text": "x"}').content_type == "application/json"
    literal = read_input("just words")
    assert literal.content_type.startswith("text/plain") and literal.body == b"just words"
    assert read_input("x" * 5000).label == "text"  # too long for a file name, still a literal


# --- the samples -------------------------------------------------------------------------


def test_run_handler_tiny_prints_outputs_errors_and_hook_timings(archives) -> None:
    code, out, _ = _run(archives("tiny"), TINY_ROW, "[1, 2]")
    assert code == 0, out
    first = next(line for line in out.splitlines() if line.startswith("[0] "))
    assert len(json.loads(first[4:])) == 10
    assert (
        "[1] error 400 BadInput: expected a JSON list of 64 numbers, got a list of 2 items" in out
    )
    for phase in (
        "unpack",
        "load",
        "initialize",
        "handle",
        "preprocess",
        "inference",
        "postprocess",
    ):
        assert f" {phase} " in out and " ms" in out


def test_run_handler_json_report(archives, tmp_path: Path) -> None:
    row = tmp_path / "row.json"
    row.write_text(TINY_ROW)
    code, out, _ = _run("--json", archives("tiny"), row, '"oops"')
    assert code == 0, out
    report = json.loads(out)
    assert report["model"] == "tiny"
    ok, bad = report["outputs"]
    assert ok["input"] == str(row) and ok["status"] == 200 and len(ok["body"]) == 10
    assert bad["error"]["code"] == 400 and "got str 'oops'" in bad["error"]["message"]
    assert {"unpack", "load", "initialize", "handle", "inference"} <= set(report["timings_ms"])


def test_run_handler_digits_classifies_image_files(archives) -> None:
    code, out, _ = _run(archives("digits"), *DIGIT_IMAGES)
    assert code == 0, out
    for idx, path in enumerate(DIGIT_IMAGES):
        line = next(line for line in out.splitlines() if line.startswith(f"[{idx}] "))
        scores = json.loads(line.split(" ", 1)[1])
        assert max(scores, key=scores.get) == path.name.split("_")[0]
    assert "decode_request" in out and "inference" in out


def test_run_handler_resnet18_batch_of_two_images(archives, tmp_path: Path) -> None:
    image = tmp_path / "photo.jpg"
    Image.new("RGB", (320, 240), (200, 30, 90)).save(image)
    code, out, _ = _run(archives("resnet18"), image, image)
    assert code == 0, out
    assert out.count('"class_') == 10
    assert "[1] {" in out


def test_run_handler_minilm_text_literals(archives) -> None:
    code, out, _ = _run("--json", archives("minilm"), "a sentence", '{"text": "another"}', '""')
    assert code == 0, out
    first, second, empty = json.loads(out)["outputs"]
    assert len(first["body"]) == 384 and len(second["body"]) == 384
    assert empty["error"]["code"] == 400


def test_run_handler_runs_as_a_module(archives) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mservd.cli.run_handler", str(archives("tiny")), TINY_ROW],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[0] [")
    assert "inference" in result.stdout


# --- failures ----------------------------------------------------------------------------


def test_run_handler_shows_traceback_and_phase_when_handle_raises(tmp_path: Path) -> None:
    archive = _handler_archive(
        tmp_path,
        "def handle(data, context):\n"
        "    if data is None:\n"
        "        return None\n"
        "    raise ValueError('bad batch of ' + str(len(data)))\n",
    )
    code, out, err = _run(archive, "x", "y")
    assert code == 1
    assert "Traceback (most recent call last)" in err
    assert "broken_handler.py" in err
    assert "handler failed in handle: ValueError: bad batch of 2" in err
    assert out == ""


def test_run_handler_names_initialize_when_initialize_raises(tmp_path: Path) -> None:
    archive = _handler_archive(
        tmp_path,
        "class Broken:\n"
        "    def initialize(self, context):\n"
        "        raise RuntimeError('no weights here')\n"
        "    def handle(self, data, context):\n"
        "        return data\n",
    )
    code, _, err = _run(archive, "x")
    assert code == 1
    assert (
        "Traceback" in err and "handler failed in initialize: RuntimeError: no weights here" in err
    )


def test_run_handler_names_the_hook_that_raised(tmp_path: Path) -> None:
    archive = _handler_archive(
        tmp_path,
        "from handlers import BaseHandler\n"
        "class Broken(BaseHandler):\n"
        "    def initialize(self, context):\n"
        "        self.initialized = True\n"
        "    def preprocess(self, data):\n"
        "        return {}['missing']\n",
    )
    code, _, err = _run(archive, "x")
    assert code == 1
    assert "handler failed in preprocess: KeyError: 'missing'" in err


def test_run_handler_rejects_a_wrong_number_of_outputs(tmp_path: Path) -> None:
    archive = _handler_archive(
        tmp_path, "def handle(data, context):\n    return None if data is None else [1]\n"
    )
    code, _, err = _run(archive, "x", "y")
    assert code == 1
    assert "returned 1 outputs for a batch of 2 requests" in err


def test_run_handler_reports_a_file_that_is_not_an_archive(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.mar"
    bogus.write_bytes(b"not a zip")
    code, _, err = _run(bogus, "x")
    assert code == 1
    assert "cannot unpack" in err and "Traceback" not in err


def test_run_handler_prints_binary_outputs_by_size(tmp_path: Path) -> None:
    archive = _handler_archive(
        tmp_path,
        "def handle(data, context):\n    return None if data is None else [b'\\x00\\x01\\x02']\n",
    )
    code, out, _ = _run(archive, "x")
    assert code == 0
    assert "[0] <3 bytes of application/octet-stream>" in out
