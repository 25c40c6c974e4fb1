"""Loading a worker's model: its handler and Context, and the archive's own requirements."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from mservd.specs import WorkerSpec

log = logging.getLogger("mservd.worker")


def set_threads(threads: int | None) -> None:
    """Every core for loading; batch by batch, the worker's share of them (``Threads``)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set by an earlier parallel op


def load(spec: WorkerSpec):
    """Build the Context and the initialised handler described by the controller's spec."""
    from handlers.context import Context
    from handlers.loader import load_handler
    from handlers.ts_compat import install_ts_aliases

    install_ts_aliases()  # handlers written for TorchServe import ts.*
    # TorchServe tells its workers so; a handler may read it
    os.environ["TS_DECODE_INPUT_REQUEST"] = "true" if spec.decode_input_request else "false"

    from handlers.metrics import MetricsRecorder

    context = Context(
        spec.model_name,
        spec.model_dir,
        spec.manifest,
        spec.batch_size,
        spec.gpu_id,
        spec.server_version,
        limit_max_image_pixels=spec.limit_max_image_pixels,
        metrics=MetricsRecorder(spec.model_name, spec.model_metrics),
        model_yaml_config=spec.model_yaml or {},
    )
    context.decode_input_request = spec.decode_input_request  # read by the TorchServe codec
    if spec.install_py_dep_per_model:
        install_model_requirements(spec.model_dir, spec.manifest or {})
    handler = load_handler(spec.model_dir, spec.handler)
    handler.initialize(context)
    return handler, context


DEPS_DIR = ".deps"
PIP_TIMEOUT = 300.0  # seconds; a pip that hangs fails the load with its output so far


class RequirementsError(Exception):
    """pip could not install the archive's requirements file."""


def install_model_requirements(model_dir: str, manifest: dict[str, Any]) -> str | None:
    """``pip install --target <model_dir>/.deps -r <requirementsFile>`` (install_py_dep_per_model).

    TorchServe's per-model dependencies: the folder goes first on ``sys.path``. Workers of one
    model share it; a lock serialises them and a marker skips a second install.
    """
    req = (manifest.get("model") or {}).get("requirementsFile")
    if not req:
        return None
    import fcntl
    import hashlib
    import subprocess

    req_path = os.path.join(model_dir, req)
    if not os.path.isfile(req_path):
        raise RequirementsError(f"The archive names requirementsFile {req!r}, but "
                                f"{req_path} does not exist.")
    target = os.path.join(model_dir, DEPS_DIR)
    with open(req_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    marker = os.path.join(target, ".mservd-installed")
    with open(os.path.join(model_dir, DEPS_DIR + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = False
        if os.path.isfile(marker):
            with open(marker) as f:
                done = f.read() == digest
        if not done:
            cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
                   "--no-input", "--target", target, "-r", req_path]
            log.info("installing %s: %s", req, " ".join(cmd))
            try:
                proc = subprocess.run(cmd, cwd=model_dir, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT, check=False)
            except subprocess.TimeoutExpired as exc:
                out = (exc.stdout or b"").decode(errors="replace")
                raise RequirementsError(f"pip install -r {req} did not finish within "
                                        f"{PIP_TIMEOUT:.0f} s:\n{out[-4000:]}") from None
            out = proc.stdout.decode(errors="replace")
            if proc.returncode != 0:
                raise RequirementsError(f"pip install -r {req} failed (exit code "
                                        f"{proc.returncode}):\n{out[-4000:]}")
            log.info("pip output:\n%s", out[-2000:])
            with open(marker, "w") as f:
                f.write(digest)
    if target not in sys.path:
        sys.path.insert(0, target)
    return target
