"""The handler's recorded metrics, shipped to the controller, which owns ``/metrics``."""

from __future__ import annotations

import sys

from mservd import protocol


def ship_metrics(sock, context) -> None:
    """Send the handler's recorded metrics to the controller, which owns /metrics, with the
    device memory this worker holds when it runs on a GPU."""
    recorder = getattr(context, "metrics", None)
    samples = [protocol.Sample(m.name, float(m.value), m.unit,
                               getattr(m.kind, "value", str(m.kind)), dict(m.dimensions))
               for m in (recorder.drain() if recorder is not None and hasattr(recorder, "drain")
                         else [])]
    device = device_memory(context)
    if device is not None:
        samples.append(protocol.Sample(protocol.DEVICE_MEMORY, float(device), "Bytes", "gauge",
                                       {}))
    if samples:
        sock.send_multipart(protocol.metrics(samples))


def device_memory(context) -> int | None:
    """Bytes PyTorch's allocator holds on this worker's GPU (None on the CPU)."""
    gpu_id = (getattr(context, "system_properties", None) or {}).get("gpu_id")
    torch = sys.modules.get("torch")
    if gpu_id is None or torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_reserved(int(gpu_id)))
