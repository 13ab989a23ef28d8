"""Loading a snapshot with torch.distributed.checkpoint without unpickling what the files say.

torch.distributed.checkpoint reads its `.metadata` with `pickle.load`, and every non-tensor value
(an optimizer's hyperparameters, the per-rank part's bytes) with `torch.load(weights_only=False)`:
code named in those files would run before faultcast could check anything. `load` here passes a
reader whose metadata goes through the DCP_METADATA allowlist (client/restricted_pickle.py) and a
planner that loads values with `weights_only=True`; tensors are read as torch reads them
(`weights_only=True` already). A refusal comes out as SnapshotReadError, not wrapped in torch's
CheckpointException.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from faultcast.client import restricted_pickle


class SnapshotReadError(ValueError):
    """A snapshot file holds what is not plain data (it is not unpickled)."""


def load(state: dict[str, Any], path: Path, group: dist.ProcessGroup | None) -> None:
    """Fill `state` from the snapshot at `path`, as torch.distributed.checkpoint.load would, with the
    restrictions above (collective under torch.distributed)."""
    reader = RestrictedReader(path)
    try:
        dcp_load(
            state,
            checkpoint_id=path,
            storage_reader=reader,
            planner=RestrictedPlanner(),
            process_group=group,
            no_dist=not dist.is_initialized(),
        )
    except CheckpointException as exc:  # every rank's failures, gathered: say ours plainly
        failures = [failure for failure, _ in exc.failures.values()]
        refused = reader.refused or next((f for f in failures if isinstance(f, SnapshotReadError)), None)
        if refused is None:
            raise
        raise SnapshotReadError(str(refused)) from exc


class RestrictedReader(FileSystemReader):
    """A FileSystemReader whose `.metadata` is unpickled through the DCP_METADATA allowlist.
    `refused`: why it refused the metadata (torch reports only a failed read)."""

    refused: SnapshotReadError | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        path = Path(os.fspath(self.path)) / name
        try:
            metadata = restricted_pickle.loads(path.read_bytes(), restricted_pickle.DCP_METADATA, str(path))
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
            self.refused = SnapshotReadError(f"the snapshot's metadata {path} is refused: {exc}")
            raise self.refused from exc
        if not isinstance(metadata, Metadata):
            self.refused = SnapshotReadError(
                f"the snapshot's metadata {path} holds a {type(metadata).__name__}"
            )
            raise self.refused
        storage_meta = metadata.storage_meta if metadata.storage_meta is not None else StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class RestrictedPlanner(DefaultLoadPlanner):
    """A DefaultLoadPlanner that loads non-tensor values with torch.load(weights_only=True)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            plain = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise SnapshotReadError(
                f"the snapshot's value {read_item.dest_index.fqn} is not plain data: {exc}"
            ) from exc
        # Handed on as torch.save'd bytes of what was just loaded under restriction: the parent puts
        # it in place (nested state dicts too) and unpickles only this plain data again.
        checked = io.BytesIO()
        torch.save(plain, checked)
        checked.seek(0)
        super().load_bytes(read_item, checked)
