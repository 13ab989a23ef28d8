"""Unpickling what the job did not sign: only the globals an allowlist names.

A pickle runs whatever callable it names. What faultcast must unpickle without a signature of the
job's (a snapshot's per-rank part written by an older faultcast, the `.metadata` file that
torch.distributed.checkpoint pickles) goes through `loads`, which resolves only the globals of an
allowlist and refuses anything else with an error naming it (the Python documentation's
"Restricting Globals"; torch's `weights_only` does the same for torch.save files).
"""

from __future__ import annotations

import _compat_pickle
import io
import pickle
from collections.abc import Callable, Mapping

import torch


class RefusedPickleError(pickle.UnpicklingError):
    """The pickle names a global outside the allowlist: nothing it names was called."""


def _storage_weights_only(data: bytes) -> object:
    """torch.storage._load_from_bytes, which a plainly pickled tensor names, with torch's own
    restrictions (the original loads its bytes with weights_only=False)."""
    return torch.load(io.BytesIO(data), weights_only=True)


# Plain data beyond what pickle's own opcodes build (a set under protocol 2, and so on; protocol 2
# pickles bytes as _codecs.encode of a str, and codecs only transform data).
_PLAIN = frozenset(
    {"builtins.set", "builtins.frozenset", "builtins.complex", "builtins.bytearray", "_codecs.encode"}
)

RANK_PART = _PLAIN | {
    "collections.OrderedDict",
    # NumPy's generator state: an array of uint32, its dtype, and NumPy scalars.
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray._reconstruct",
    "numpy._core.multiarray.scalar",
    "numpy.core.numeric._frombuffer",  # arrays under protocol 5
    "numpy._core.numeric._frombuffer",
    # torch's and CUDA's generator states: byte tensors.
    "torch._utils._rebuild_tensor_v2",
    "torch.storage._load_from_bytes",
    "torch.Size",
}
"""Enough for Python's, NumPy's and torch's generator states and plain containers, numbers and
strings: what an unsigned per-rank part may hold."""

DCP_METADATA = _PLAIN | {
    "collections.OrderedDict",
    "pathlib.PosixPath",
    "pathlib.PurePosixPath",
    "torch.Size",
    "torch.serialization._get_layout",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
}
"""What torch.distributed.checkpoint's `.metadata` holds (its dataclasses, sizes, dtypes, paths)."""

# Allowed names that resolve to something safer than what they name.
_INSTEAD: Mapping[str, Callable[..., object]] = {"torch.storage._load_from_bytes": _storage_weights_only}


def loads(data: bytes, allowed: frozenset[str], what: str) -> object:
    """Unpickle `data` resolving only the globals in `allowed` ("module.name"; torch's dtypes always);
    RefusedPickleError naming the first other one, and `what` was being read."""
    return _Restricted(io.BytesIO(data), allowed, what).load()


class _Restricted(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, allowed: frozenset[str], what: str) -> None:
        super().__init__(file)
        self._allowed, self._what = allowed, what

    def find_class(self, module: str, name: str) -> object:
        # Python 2's names (protocol 2 pickles say __builtin__.set): pickle maps them the same way.
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        qualified = f"{module}.{name}"
        if qualified in _INSTEAD and qualified in self._allowed:
            return _INSTEAD[qualified]
        if qualified in self._allowed or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise RefusedPickleError(
            f"{self._what} names the global {qualified}, which is not allowed here (only plain data "
            "is unpickled without the job's signature)"
        )
