"""Regenerate the Python stubs in ``generated/`` from the ``.proto`` files in ``protos/``.

Besides the modules, protoc writes each message module's ``.pyi``: protoc's modules build their
classes at import time, so without it mypy knows none of the message types the servicers use.

``python -m mservd.frontends.grpc.compile_protos [OUT_DIR]``. The stubs are committed so a daemon
needs no protoc at run time; tests/unit/test_grpc_stubs.py regenerates them into a temporary
folder and compares byte for byte, so they cannot drift from the .proto files.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = HERE / "protos"
GENERATED = HERE / "generated"
PROTO_FILES = ("inference.proto", "management.proto", "grpc_predict_v2.proto",
               "mservd_management.proto")
PACKAGE = "mservd.frontends.grpc.generated"

log = logging.getLogger(__name__)


def generate(out_dir: Path = GENERATED) -> list[Path]:
    """Run grpc_tools.protoc on every proto (modules and their type stubs); imports between
    modules made package-relative."""
    import grpc_tools
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}",
            *[str(PROTOS / name) for name in PROTO_FILES]]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_FILES} in {PROTOS}")
    written = []
    for name in PROTO_FILES:
        stem = name.removesuffix(".proto")
        for path in (out_dir / f"{stem}_pb2.py", out_dir / f"{stem}_pb2_grpc.py"):
            text = path.read_text()
            # protoc writes `import x_pb2 as ...`; inside a package the import must be relative
            text = text.replace(f"import {stem}_pb2 as ", f"from . import {stem}_pb2 as ")
            path.write_text(text)
            written.append(path)
        written.append(out_dir / f"{stem}_pb2.pyi")  # imports only google.protobuf's modules
    return written


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else GENERATED):
        log.info("wrote %s", path)
