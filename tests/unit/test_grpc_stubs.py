"""The committed gRPC stubs are exactly what the .proto files generate: they cannot drift."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc_tools")

from mservd.frontends.grpc.compile_protos import GENERATED, generate


def test_grpc_stubs_match_a_fresh_generation(tmp_path) -> None:
    written = generate(tmp_path)
    assert written
    for path in written:
        committed = GENERATED / path.name
        assert committed.exists(), f"{path.name} is not committed; run " \
                                   "python -m mservd.frontends.grpc.compile_protos"
        assert committed.read_bytes() == path.read_bytes(), (
            f"{path.name} differs from its .proto; run python -m mservd.frontends.grpc.compile_protos")
