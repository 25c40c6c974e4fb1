"""CUDA: workers forked from the zygote each initialise CUDA on their own ``cuda:<gpu_id>``
(the zygote never touches CUDA, or forking would break it), batches run on the device, describe
shows each worker's device and its device memory, and the samples answer as on the CPU within
tolerance. Skipped without an NVIDIA GPU; ``make test-gpu`` runs this folder alone."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HAS_GPU = bool(os.path.isdir("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus"))
pytestmark = pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (make test-gpu)")
BATCHES = 'mservd_batch_size_count{model_name="resnet18",model_version="1.0"}'


def _integration():
    """tests/integration/conftest.py under its own name (two modules named conftest clash)."""
    spec = importlib.util.spec_from_file_location(
        "integration_conftest", REPO / "tests" / "integration" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    helpers = _integration()
    store = tmp_path_factory.mktemp("gpu-store")
    helpers._build_all().build_samples(export_path=store)
    daemon = helpers.Daemon(tmp_path_factory.mktemp("gpu"), store,
                            {"load_models": "resnet18.mar,tiny.mar",
                             "default_workers_per_model": 2, "batch_size": 8,
                             "max_batch_delay": 20})
    daemon.start()
    yield daemon
    daemon.stop()


def gpu_pids() -> dict[int, int]:
    """{pid: MiB} of the processes holding a CUDA context, as nvidia-smi sees them."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return {int(pid): int(mib) for pid, mib in
            (line.split(",") for line in out.splitlines() if line.strip())}


def test_each_worker_has_its_own_cuda_context_and_the_zygote_none(daemon) -> None:
    workers = daemon.describe("resnet18")[0]["workers"]
    assert all(w["gpu"] for w in workers)
    holders = gpu_pids()
    assert {w["pid"] for w in workers} <= set(holders), holders
    zygotes = [p.pid for p in daemon.descendants() if "mservd.worker.zygote" in " ".join(p.cmdline())]
    assert zygotes and not set(zygotes) & set(holders)
    assert daemon.proc.pid not in holders  # nor the controller


def test_describe_shows_each_workers_device_memory(daemon) -> None:
    assert daemon.predict("resnet18", data=_image()).status_code == 200
    for worker in daemon.describe("resnet18")[0]["workers"]:
        assert worker["gpuUsage"].startswith("gpuId::")
        assert "memory.used [MiB]::" in worker["gpuUsage"], worker


def test_batched_answers_on_the_gpu_equal_the_cpus(daemon) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.workloads import LoadedModel

    image = _image()
    on_cpu = LoadedModel(daemon.store / "resnet18.mar", 8)  # no gpu_id: the CPU, here
    expected = on_cpu.handle([image], "image/png")[0]  # {label: probability}, the top 5
    on_cpu.close()
    before = daemon.metrics().get(BATCHES, 0)
    with ThreadPoolExecutor(16) as pool:  # concurrent: they batch on the device
        answers = list(pool.map(lambda _: daemon.predict("resnet18", data=image), range(32)))
    for answer in answers:
        assert answer.status_code == 200, answer.text
        got = answer.json()
        got = got[0] if isinstance(got, list) else got
        assert set(got) == set(expected)
        for label, probability in got.items():
            assert probability == pytest.approx(expected[label], abs=1e-3)
    assert daemon.metrics()[BATCHES] - before < 32  # some requests shared a batch


def _image() -> bytes:
    from benchmarks.workloads import resnet_image

    return resnet_image()
