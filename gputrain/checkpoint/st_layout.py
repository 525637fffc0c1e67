"""The byte layout of a safetensors file, computed from names, shapes and dtypes alone.

A safetensors file is an 8-byte little-endian header length, a JSON header (per tensor its dtype,
shape and `data_offsets` [start, end) relative to the end of the header; an optional
`__metadata__` of strings first), padded with spaces to a multiple of 8, then the raw
little-endian bytes of every tensor. This module lays a file out exactly as safetensors' own
writer (`save_file`, `save_model`) does — tensors ordered by dtype (its order, below) then by name,
compact JSON, UTF-8 names — so a file written piece by piece from this layout (final_weights.py:
each rank writes its own shards in place) is byte for byte the one `save_model` would write of the
same weights. One exception: safetensors orders `__metadata__`'s entries as a hash map does
(differently from run to run); here they are sorted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

# safetensors' dtype names, in the order its writer puts them (largest alignment first; ties as its
# Rust enum orders them, read off safetensors 0.8's output: tests/unit/checkpoint/test_st_layout.py)
_ORDER: tuple[tuple[str, torch.dtype], ...] = tuple(
    (name, dtype)
    for name, attr in (
        ("U64", "uint64"),
        ("I64", "int64"),
        ("F64", "float64"),
        ("C64", "complex64"),
        ("F32", "float32"),
        ("U32", "uint32"),
        ("I32", "int32"),
        ("BF16", "bfloat16"),
        ("F16", "float16"),
        ("U16", "uint16"),
        ("I16", "int16"),
        ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
        ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
        ("F8_E4M3", "float8_e4m3fn"),
        ("F8_E5M2", "float8_e5m2"),
        ("I8", "int8"),
        ("U8", "uint8"),
        ("BOOL", "bool"),
    )
    if (dtype := getattr(torch, attr, None)) is not None
)
_RANK = {dtype: i for i, (_, dtype) in enumerate(_ORDER)}
_NAME = {dtype: name for name, dtype in _ORDER}

HEADER_ALIGN = 8


class UnsupportedDtype(ValueError):
    """A tensor's dtype has no safetensors name."""


@dataclass(frozen=True, slots=True)
class Layout:
    header: bytes
    """The file's first bytes: the length prefix, the JSON header and its padding."""
    starts: dict[str, int]
    """Each tensor's first byte, from the start of the file."""
    size: int
    """The file's length in bytes."""


def layout(tensors: Mapping[str, tuple[tuple[int, ...], torch.dtype]], metadata: Mapping[str, str] | None) -> Layout:
    """The layout of a file holding `tensors` (name -> (shape, dtype)) and `metadata`.

    Raises:
        UnsupportedDtype: a dtype safetensors cannot store.
    """
    for name, (_, dtype) in tensors.items():
        if dtype not in _RANK:
            raise UnsupportedDtype(f"{name}: safetensors has no dtype for {dtype}")
    order = sorted(tensors, key=lambda n: (_RANK[tensors[n][1]], n.encode()))
    entries: dict[str, object] = {}
    if metadata is not None:  # {} too: safetensors writes an empty one
        entries["__metadata__"] = dict(sorted(metadata.items()))
    offsets: dict[str, int] = {}
    at = 0
    for name in order:
        shape, dtype = tensors[name]
        size = math.prod(shape) * dtype.itemsize
        entries[name] = {"dtype": _NAME[dtype], "shape": list(shape), "data_offsets": [at, at + size]}
        offsets[name] = at
        at += size
    text = json.dumps(entries, ensure_ascii=False, separators=(",", ":")).encode()
    text += b" " * (-len(text) % HEADER_ALIGN)
    header = len(text).to_bytes(8, "little") + text
    return Layout(header=header, starts={n: len(header) + o for n, o in offsets.items()}, size=len(header) + at)
