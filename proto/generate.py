"""Regenerate the committed protobuf and gRPC stubs in proto/faultcast/v1/.

The stubs are committed (so an install needs no code generation) and tests/test_proto_stubs.py
fails when they differ from a fresh run of this script with the pinned grpcio-tools and
mypy-protobuf. Usage: python proto/generate.py [OUT_DIR]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_FILES = sorted(
    p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / "faultcast" / "v1").glob("*.proto")
)


def generate(out_root: Path) -> list[Path]:
    """Write the stubs under out_root/faultcast/v1 and return their paths."""
    out_root.mkdir(parents=True, exist_ok=True)
    plugin_dir = Path(sys.executable).parent  # protoc-gen-mypy* live beside the venv's python
    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin=protoc-gen-mypy={plugin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_FILES}")
    return sorted((out_root / "faultcast" / "v1").glob("*_pb2*.py*"))


def main() -> None:
    if len(sys.argv) > 1:
        generate(Path(sys.argv[1]))
        return
    tmp = PROTO_ROOT / ".gen"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for path in generate(tmp):
            shutil.copyfile(path, PROTO_ROOT / "faultcast" / "v1" / path.name)
            print(f"wrote proto/faultcast/v1/{path.name}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
