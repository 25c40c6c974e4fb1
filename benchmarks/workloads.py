"""The benchmark models' inputs, their expected answers, the answer checks and the in-process limit.

- ``tiny``: 64 distinct seeded JSON lists of 64 floats; an answer is right when it is a JSON list
  of 10 numbers equal, within 1e-4, to what the handler gives for that input with no server.
- ``resnet18``: one fixed 224x224 PNG made here with PIL; an answer is right when it is a JSON
  object with the same 5 labels as the in-process result and each probability within 1e-4.

Expected answers come from the archive's own handler run in this process (the way a worker runs
it), so the same check holds for every system. :func:`inprocess_limit` times that handler on
full batches with no server in the way: the ceiling a server can approach.
"""

from __future__ import annotations

import io
import json
import math
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Check

TINY_INPUTS = 64
TOLERANCE = 1e-4


def tiny_bodies(count: int = TINY_INPUTS, seed: int = 8) -> list[bytes]:
    rng = random.Random(seed)
    return [json.dumps([round(rng.uniform(-1, 1), 4) for _ in range(64)]).encode()
            for _ in range(count)]


def resnet_image() -> bytes:
    """A fixed 224x224 RGB PNG: smooth gradients plus a pattern, the same bytes every run."""
    from PIL import Image

    img = Image.new("RGB", (224, 224))
    img.putdata([((x * 255) // 223, (y * 255) // 223, ((x ^ y) * 7) % 256)
                 for y in range(224) for x in range(224)])
    out = io.BytesIO()
    img.save(out, format="PNG", optimize=False)
    return out.getvalue()


class LoadedModel:
    """An archive's handler loaded in this process, as a worker loads it."""

    def __init__(self, archive: Path, batch_size: int = 8, threads: int | None = None) -> None:
        import torch

        import archiver
        from handlers.context import Context
        from handlers.loader import load_handler
        from handlers.ts_compat import install_ts_aliases

        if threads:
            torch.set_num_threads(threads)
        install_ts_aliases()
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-model-")
        model_dir = Path(self._tmp.name) / "model"
        manifest = archiver.unpack(archive, model_dir)
        if str(model_dir) not in sys.path:
            sys.path.insert(0, str(model_dir))
        self.context = Context(manifest.model_name, str(model_dir), manifest.to_dict(),
                               batch_size, None, "bench")
        self.handler = load_handler(str(model_dir), manifest.handler)
        self.handler.initialize(self.context)
        self.name = manifest.model_name

    def handle(self, bodies: list[bytes], content_type: str) -> list[Any]:
        """decode (as the worker does) -> handle -> the outputs, one per body."""
        from mservd.worker.payload import decode_input

        data = []
        for body in bodies:
            value = decode_input(content_type, body)
            data.append({"body": value, "data": value})
        self.context.begin_batch([str(uuid.uuid4()) for _ in bodies],
                                 [{"content-type": content_type} for _ in bodies])
        return self.handler.handle(data, self.context)

    def close(self) -> None:
        self._tmp.cleanup()


@dataclass
class ModelWork:
    """One benchmark model: what to POST, its content type, and the check of each answer."""

    name: str
    bodies: list[bytes]
    content_type: str
    expected: list[Any]
    check: Check


def _close(a: float, b: float) -> bool:
    return isinstance(a, (int, float)) and math.isfinite(a) and abs(a - b) <= TOLERANCE


def tiny_check(expected: list[list[float]]) -> Check:
    def check(idx: int, status: int, body: bytes) -> str | None:
        try:
            got = json.loads(body)
        except ValueError:
            return "not JSON"
        want = expected[idx % len(expected)]
        if not isinstance(got, list) or len(got) != 10:
            return "not a list of 10"
        for g, w in zip(got, want):
            if not _close(g, w):
                return f"value {g!r} != expected {w!r}"
        return None
    return check


def resnet_check(expected: dict[str, float]) -> Check:
    def check(idx: int, status: int, body: bytes) -> str | None:
        try:
            got = json.loads(body)
        except ValueError:
            return "not JSON"
        if isinstance(got, list) and len(got) == 1:
            got = got[0]
        if not isinstance(got, dict) or len(got) != 5:
            return "not a top-5 object"
        if set(got) != set(expected):
            return f"labels {sorted(got)} != {sorted(expected)}"
        for label, prob in got.items():
            if not _close(prob, expected[label]):
                return f"{label}: {prob!r} != {expected[label]!r}"
        return None
    return check


def build_workloads(store: Path, batch_size: int) -> dict[str, ModelWork]:
    """Inputs, expected outputs and checks of ``tiny`` and ``resnet18`` from ``store``."""
    tiny = LoadedModel(store / "tiny.mar", batch_size)
    bodies = tiny_bodies()
    expected = [list(map(float, out)) for out in tiny.handle(bodies, "application/json")]
    tiny.close()
    resnet = LoadedModel(store / "resnet18.mar", batch_size)
    image = resnet_image()
    out = resnet.handle([image], "image/png")[0]
    resnet.close()
    return {
        "tiny": ModelWork("tiny", bodies, "application/json", expected, tiny_check(expected)),
        "resnet18": ModelWork("resnet18", [image], "image/png", [out], resnet_check(out)),
    }


def inprocess_limit(archive: Path, work: ModelWork, batch_size: int, seconds: float,
                    threads: int | None = None) -> dict[str, Any]:
    """Requests/s of the handler alone on full batches (decode -> handle -> encode each answer)."""
    from mservd.worker.payload import encode_output

    model = LoadedModel(archive, batch_size, threads)
    batch = [work.bodies[i % len(work.bodies)] for i in range(batch_size)]
    for _ in range(3):  # warm up
        model.handle(batch, work.content_type)
    batches = 0
    t0 = time.perf_counter()
    latencies = []
    while time.perf_counter() - t0 < seconds:
        s = time.perf_counter()
        outs = model.handle(batch, work.content_type)
        for item in outs:
            encode_output(item)
        latencies.append(time.perf_counter() - s)
        batches += 1
    elapsed = time.perf_counter() - t0
    model.close()
    import torch

    latencies.sort()
    return {"model": work.name, "batch_size": batch_size, "threads": torch.get_num_threads(),
            "batches": batches, "seconds": round(elapsed, 3),
            "throughput": batches * batch_size / elapsed,
            "batch_ms_p50": latencies[len(latencies) // 2] * 1000}
