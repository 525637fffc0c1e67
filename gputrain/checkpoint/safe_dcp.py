"""Read torch.distributed.checkpoint (DCP) directories without running anything they contain.

DCP's own reader unpickles `.metadata` with plain `pickle.load`, and its default planner loads
non-tensor items (optimizer hyperparameters) with `torch.load(weights_only=False)`: a crafted
checkpoint could run code on resume. The manifest's checksums do not prevent that — whoever can
write the files can rewrite the manifest. So the metadata goes through an unpickler that admits
only DCP's own metadata classes, and byte items through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# Everything a DCP .metadata file needs; found by recording what real ones ask for.
_ALLOWED: set[tuple[str, str]] = {
    (_DCP_METADATA, name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


class UnsafeCheckpointContent(Exception):
    """A checkpoint file asks to build something other than checkpoint data."""


class UnreadableMetadata(UnsafeCheckpointContent):
    """A .metadata file that is not a pickle of DCP metadata at all (truncated, overwritten)."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise UnsafeCheckpointContent(f"DCP metadata asks for {module}.{name}, which is not checkpoint data")


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata can only contain DCP's metadata classes.

    `dcp.load` swallows a failed metadata read and retries with a per-rank file, so the refusal is
    also kept in `refusal` (and raised again on the retry) for the caller to report.
    """

    refusal: UnsafeCheckpointContent | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.refusal is not None:
            raise self.refusal
        try:
            return self._read_metadata(kwargs.get("rank"))
        except UnsafeCheckpointContent as err:
            self.refusal = err
            raise

    def _read_metadata(self, rank: int | None) -> Metadata:
        get_path = getattr(self, "_get_metadata_path", None)
        path = get_path(rank) if get_path is not None else Path(self.path) / ".metadata"
        metadata = read_metadata(Path(path))
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Every file the metadata names must be a plain name inside the checkpoint directory."""
        for info in (metadata.storage_data or {}).values():
            name = getattr(info, "relative_path", None)
            if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
                raise UnsafeCheckpointContent(f"DCP metadata refers to {name!r}, a path outside the checkpoint")
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)


def read_metadata(path: Path) -> Metadata:
    """A DCP .metadata file, unpickled with only DCP's metadata classes allowed.

    Raises:
        UnsafeCheckpointContent: it asks for anything else (UnreadableMetadata: it is no such pickle).
    """
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f).load()
        except UnsafeCheckpointContent:
            raise
        except Exception as err:  # noqa: BLE001 - truncated, or not a pickle at all
            raise UnreadableMetadata(f"DCP metadata is unreadable ({type(err).__name__})") from None
    if not isinstance(metadata, Metadata):
        raise UnreadableMetadata(f"DCP metadata holds a {type(metadata).__name__}, not Metadata")
    return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that reads non-tensor items with weights_only=True."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise UnsafeCheckpointContent(
                f"a DCP item ({read_item.dest_index.fqn}) holds objects other than "
                f"tensors and plain values ({str(err).splitlines()[0][:100]})"
            ) from None
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
