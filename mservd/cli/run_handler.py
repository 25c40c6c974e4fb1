"""``mservd run-handler ARCHIVE INPUT...``: run one batch through an archive's handler, no server.

This module owns the debugging path a handler author uses before serving: unpack the archive,
build the same :class:`handlers.Context` a worker builds, load and initialize the handler, run
one batch made of the given inputs through the worker's own batch path
(:func:`mservd.worker.batches.answer_batch`: the same rows, encodings and errors as when served), and print
each answer and how long each phase took. It starts no processes and opens no sockets; a
handler that raises is shown with its traceback instead of answered 500.

An INPUT is a file (its content type guessed from the suffix) or, when no such file exists, a
literal: JSON when it parses, otherwise text. Each is one ``/predictions`` request with that
body.

    python -m mservd.cli.run_handler model_store/tiny.mar '[0, 1, ...]'
"""

from __future__ import annotations

import json
import mimetypes
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import click
import yaml

from mservd import protocol
from mservd.worker.payload import JSON_TYPE, media_type

__all__ = ["HandlerFailed", "run_handler_command"]

#: Suffixes whose content type decides how the body is decoded; the rest go by ``mimetypes``.
CONTENT_TYPES = {".json": JSON_TYPE, ".txt": "text/plain; charset=utf-8"}
BINARY_TYPE = "application/octet-stream"
MAX_RESPONSE_SIZE = 1 << 31  # run-handler prints what the handler made, however large
#: The phases of a run, in order; each is timed.
PHASES = ("unpack", "load", "initialize", "handle")
#: The hooks of a ``BaseHandler`` subclass that are timed separately inside ``handle``; the
#: built-ins decode each request with ``decode_request`` instead of calling ``preprocess``.
HOOKS = ("preprocess", "decode_request", "inference", "postprocess")


class HandlerFailed(click.ClickException):
    """The handler raised: shows the traceback, then which phase failed. Exit code 1."""

    def __init__(self, phase: str, exc: BaseException) -> None:
        super().__init__(f"handler failed in {phase}: {type(exc).__name__}: {exc}")
        self.phase = phase
        self.traceback = "".join(traceback.format_exception(exc))

    def show(self, file: Any = None) -> None:
        click.echo(self.traceback, err=True, nl=False)
        super().show(file)


@dataclass(frozen=True)
class Input:
    """One request of the batch: where it came from and the body a client would send."""

    label: str
    content_type: str
    body: bytes


@dataclass
class PhaseClock:
    """Seconds spent per phase, and the innermost phase an exception left."""

    seconds: dict[str, float] = field(default_factory=dict)
    failed_in: str | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            # Inner phases unwind first, so the first one recorded is where it happened.
            if self.failed_in is None:
                self.failed_in = name
            raise
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return function(*args, **kwargs)

        return timed


def read_input(arg: str) -> Input:
    """The request an INPUT argument stands for: a file's bytes, else the literal itself."""
    path = Path(arg)
    try:
        is_file = path.is_file()
    except OSError:  # a literal too long to be a file name
        is_file = False
    if is_file:
        suffix = path.suffix.lower()
        guessed = CONTENT_TYPES.get(suffix) or mimetypes.guess_type(path.name)[0] or BINARY_TYPE
        return Input(str(path), guessed, path.read_bytes())
    try:
        json.loads(arg)
    except ValueError:
        return Input("text", CONTENT_TYPES[".txt"], arg.encode("utf-8"))
    return Input("json", JSON_TYPE, arg.encode("utf-8"))


@dataclass
class Outcome:
    """The result of running one batch."""

    model_name: str
    inputs: list[Input]
    outputs: list[dict[str, Any]]
    seconds: dict[str, float]


def run_batch(archive: Path, inputs: list[Input], clock: PhaseClock) -> Outcome:
    """Unpack ``archive``, load its handler and run ``inputs`` as one batch.

    :raises HandlerFailed: the handler raised while loading, initializing or handling.
    :raises click.ClickException: the archive cannot be read, or the handler broke the
        one-output-per-request contract.
    """
    import torch

    import archiver
    import handlers
    from mservd.worker.batches import answer_batch
    from mservd.worker.handler_call import BatchShapeError

    with tempfile.TemporaryDirectory(prefix="mservd-run-handler-") as tmp:
        model_dir = Path(tmp) / "model"
        with clock.phase("unpack"):
            try:
                manifest = archiver.unpack(archive, model_dir)
            except archiver.ArchiveError as exc:
                raise click.ClickException(f"cannot unpack {str(archive)!r}: {exc}") from None
            yaml_config = _model_yaml_config(model_dir, manifest.config_file)
        if not manifest.handler:
            raise click.ClickException(
                f"archive {str(archive)!r} names no handler; rebuild it with --handler."
            )
        context = handlers.Context(
            model_name=manifest.model_name,
            model_dir=str(model_dir),
            manifest=manifest.to_dict(),
            batch_size=len(inputs),
            gpu=0 if torch.cuda.is_available() else None,
            mms_version=_server_version(),
            model_yaml_config=yaml_config,
        )
        phase = "load"
        try:
            with clock.phase("load"):
                loaded = handlers.load_handler(str(model_dir), manifest.handler)
            phase = "initialize"
            with clock.phase("initialize"):
                loaded.initialize(context)
            _time_hooks(loaded, clock)
            requests = [protocol.Request(str(uuid.uuid4()).encode(), protocol.CODEC_TORCHSERVE,
                                         [("body", item.content_type)],
                                         {"content-type": item.content_type}, [item.body])
                        for item in inputs]
            phase = "handle"
            with clock.phase("handle"):
                answers = answer_batch(loaded, context, requests, MAX_RESPONSE_SIZE,
                                              raise_failure=True)
        except BatchShapeError as exc:
            raise click.ClickException(f"handler failed in handle: {exc}") from None
        except Exception as exc:
            raise HandlerFailed(clock.failed_in or phase, exc) from None
        results = {r.rid: r for r in answers}
        outputs = [_describe(idx, results[request.rid]) for idx, request in enumerate(requests)]
        return Outcome(manifest.model_name, inputs, outputs, clock.seconds)


def _model_yaml_config(model_dir: Path, config_file: str | None) -> dict[str, Any]:
    if not config_file:
        return {}
    path = model_dir / config_file
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise click.ClickException(f"cannot read the model config {config_file!r}: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise click.ClickException(
            f"the model config {config_file!r} holds a {type(loaded).__name__}; "
            "it must be a YAML mapping of keys to values."
        )
    return loaded


def _server_version() -> str:
    try:
        return metadata.version("mservd")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _time_hooks(loaded: Any, clock: PhaseClock) -> None:
    """Time a ``BaseHandler``'s hooks by shadowing them on the instance, which ``handle`` calls."""
    import handlers

    service = loaded.service
    if not isinstance(service, handlers.BaseHandler):
        return
    for hook in HOOKS:
        if callable(getattr(service, hook, None)):
            setattr(service, hook, clock.wrap(hook, getattr(service, hook)))


def _describe(idx: int, result: protocol.Result) -> dict[str, Any]:
    """One answer as the worker sent it: status, content type and body, or its error."""
    head = protocol.Head.parse(result.head)
    if head.status >= 400:
        try:
            error = json.loads(result.body)
        except ValueError:
            error = {"message": result.body.decode("utf-8", "replace")}
        return {"index": idx, "error": {"code": head.status, "type": error.get("type", ""),
                                        "message": error.get("message", "")}}
    described: dict[str, Any] = {
        "index": idx,
        "status": head.status,
        "content_type": head.content_type,
        "bytes": len(result.body),
        "body": None,
    }
    kind = media_type(head.content_type)
    if kind == JSON_TYPE or kind.endswith("+json") or kind.startswith("text/"):
        try:
            described["body"] = result.body.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return described


def _json_value(output: dict[str, Any]) -> Any:
    """The output parsed, for ``--json``: readers should not have to parse a string again."""
    kind = media_type(output.get("content_type"))
    if output.get("body") is not None and (kind == JSON_TYPE or kind.endswith("+json")):
        try:
            return json.loads(output["body"])
        except ValueError:
            pass
    return output.get("body")


def _print_text(outcome: Outcome) -> None:
    for output in outcome.outputs:
        prefix = f"[{output['index']}]"
        if "error" in output:
            error = output["error"]
            click.echo(f"{prefix} error {error['code']} {error['type']}: {error['message']}")
            continue
        status = "" if output["status"] == 200 else f"(status {output['status']}) "
        if output["body"] is None:
            click.echo(f"{prefix} {status}<{output['bytes']} bytes of {output['content_type']}>")
        else:
            click.echo(f"{prefix} {status}{output['body']}")
    click.echo("timings:")
    for name in (*PHASES, *HOOKS):
        if name in outcome.seconds:
            label = f"  {name}" if name in HOOKS else name
            click.echo(f"  {label:<16} {outcome.seconds[name] * 1000:10.2f} ms")


def _print_json(outcome: Outcome) -> None:
    for output, item in zip(outcome.outputs, outcome.inputs, strict=True):
        output["input"] = item.label
        if "error" not in output:
            output["body"] = _json_value(output)
    report = {
        "model": outcome.model_name,
        "outputs": outcome.outputs,
        "timings_ms": {name: round(s * 1000, 3) for name, s in outcome.seconds.items()},
    }
    click.echo(json.dumps(report, indent=2))


@click.command("run-handler")
@click.argument("archive", type=click.Path(exists=True, path_type=Path))
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON report instead of text.")
def run_handler_command(archive: Path, inputs: tuple[str, ...], as_json: bool) -> None:
    """Run one batch of INPUTs through ARCHIVE's handler, without a server.

    Each INPUT is a file (.json is sent as JSON, .txt as text, anything else as bytes) or a
    literal (JSON if it parses, else text). Prints each output by input index, then the time
    of each phase: unpack, load, initialize, handle (and preprocess, inference, postprocess
    for BaseHandler subclasses). Exits 1 when the handler raises, after its traceback.
    """
    items = [read_input(arg) for arg in inputs]
    for idx, (arg, item) in enumerate(zip(inputs, items, strict=True)):
        if item.label == "text" and Path(arg).suffix and " " not in arg:
            click.echo(f"input {idx}: no file {arg!r}; sending it as text.", err=True)
    outcome = run_batch(archive, items, PhaseClock())
    if as_json:
        _print_json(outcome)
    else:
        _print_text(outcome)


if __name__ == "__main__":
    run_handler_command(prog_name="mservd run-handler")
