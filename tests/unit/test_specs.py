"""Child-process specs: what the daemon sends comes back the same, and a typo is an error."""

from __future__ import annotations

import pytest

from mservd.specs import GrpcFrontendSpec, WorkerSpec


def worker_spec(**changes) -> WorkerSpec:
    values = {"worker_id": "9000", "endpoint": "ipc:///x", "model_name": "m", "version": "1.0",
              "model_dir": "/m", "manifest": {"model": {}}, "handler": "h.py", "batch_size": 4,
              "gpu_id": None, "threads": 2, "model_yaml": {"v2": {}}, "max_response_size": 100}
    return WorkerSpec(**{**values, **changes})


def test_specs_round_trip_through_json() -> None:
    spec = worker_spec(gpu_id=1, install_py_dep_per_model=True)
    assert WorkerSpec.from_json(spec.to_json()) == spec
    grpc = GrpcFrontendSpec(controller="ipc:///c", host="127.0.0.1", management_host="::1",
                            inference_port=0, management_port=0, ports_file="/p", auth=True,
                            max_request_size=1, max_response_size=2, reply_timeout=3.0,
                            drain_timeout=4.0, connections=5, handshake_timeout=6.0)
    assert GrpcFrontendSpec.from_json(grpc.to_json()) == grpc


def test_specs_refuse_an_unknown_or_missing_field() -> None:
    doc = worker_spec().__dict__ | {"batchsize": 4}
    with pytest.raises(TypeError, match="batchsize"):
        WorkerSpec.from_json(doc)
    with pytest.raises(TypeError, match="endpoint"):
        WorkerSpec.from_json({"worker_id": "1"})
