"""Regenerate the committed protobuf and gRPC stubs in proto/faultcast/v1/ (the `faultcast.v1`
package) from the .proto files in proto/faultcast_api/v1/.

The .proto files live under faultcast_api/ so that a third party generating Python stubs from them
gets a module `faultcast_api.v1` that never shadows the installed `faultcast` package (gRPC's own
`grpc_health` does the same with `grpc.health.v1`). The stubs shipped inside faultcast are imported as
`faultcast.v1`, so the generated import lines are rewritten from one to the other; the descriptors
keep their file names (faultcast_api/v1/*.proto) and the wire names stay `faultcast.v1.*`, but they
are registered in a pool of faultcast's own (faultcast.v1.pool.POOL), not protobuf's default pool,
where a third party's stubs of the same files (perhaps another revision) register theirs.

The stubs are committed (so an install needs no code generation) and tests/test_proto_stubs.py
fails when they differ from a fresh run of this script with the pinned grpcio-tools and
mypy-protobuf. Usage: python proto/generate.py [OUT_DIR]  (OUT_DIR/faultcast/v1 gets the stubs)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
SOURCE = "faultcast_api/v1"  # where the .proto files are, relative to PROTO_ROOT
TARGET = "faultcast/v1"  # where the installed package's stubs go
PROTO_FILES = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / SOURCE).glob("*.proto"))


# Where generated code registers its file, and what the installed stubs register theirs in instead:
# faultcast.v1.pool.POOL, so that stubs a third party generates from another revision of the same
# files (same file and message names, in the default pool) load in the same process.
_DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = "_faultcast_pool.POOL.AddSerializedFile("
_BUILDER_IMPORT = "from google.protobuf.internal import builder as _builder\n"
_POOL_IMPORT = "from faultcast.v1 import pool as _faultcast_pool\n"


def _as_installed(text: str) -> str:
    """Generated imports name the .proto's folder; the installed package is faultcast.v1, and its
    descriptors live in faultcast.v1.pool.POOL."""
    text = text.replace("faultcast_api.v1", "faultcast.v1").replace(
        "faultcast__api_dot_v1", "faultcast_dot_v1"
    )
    if _DEFAULT_POOL in text:  # a _pb2.py module (not a stub or a _grpc module)
        if text.count(_DEFAULT_POOL) != 1 or text.count(_BUILDER_IMPORT) != 1:
            raise RuntimeError("protoc's Python output changed shape: update proto/generate.py")
        text = text.replace(_DEFAULT_POOL, _OWN_POOL).replace(_BUILDER_IMPORT, _BUILDER_IMPORT + _POOL_IMPORT)
    return text


def generate(out_root: Path) -> list[Path]:
    """Write the stubs under out_root/faultcast/v1 and return their paths."""
    raw = out_root / ".raw"
    raw.mkdir(parents=True, exist_ok=True)
    plugin_dir = Path(sys.executable).parent  # protoc-gen-mypy* live beside the venv's python
    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={raw}",
        f"--grpc_python_out={raw}",
        f"--plugin=protoc-gen-mypy={plugin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={raw}",
        f"--mypy_grpc_out={raw}",
        *PROTO_FILES,
    ]
    try:
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_FILES}")
        target = out_root / TARGET
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted((raw / SOURCE).glob("*_pb2*.py*")):
            (target / path.name).write_text(_as_installed(path.read_text()))
    finally:
        shutil.rmtree(raw, ignore_errors=True)
    return sorted(target.glob("*_pb2*.py*"))


def main() -> None:
    if len(sys.argv) > 1:
        generate(Path(sys.argv[1]))
        return
    tmp = PROTO_ROOT / ".gen"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for path in generate(tmp):
            shutil.copyfile(path, PROTO_ROOT / TARGET / path.name)
            print(f"wrote proto/{TARGET}/{path.name}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
