"""st_layout.py lays a file out byte for byte as safetensors' own writer does."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save

from gputrain.checkpoint.st_layout import UnsupportedDtype, layout

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
          torch.float8_e5m2fnuz, torch.complex64, torch.uint64, torch.uint32, torch.uint16]


def _filled(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> bytes:
    """The file written from the layout: header, then each tensor's bytes at its start."""
    plan = layout({n: (tuple(t.shape), t.dtype) for n, t in tensors.items()}, metadata)
    out = bytearray(plan.size)
    out[: len(plan.header)] = plan.header
    for name, t in tensors.items():
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[plan.starts[name] : plan.starts[name] + len(raw)] = raw
    return bytes(out)


@pytest.mark.parametrize(
    ("tensors", "metadata"),
    [
        ({f"t{i}": torch.zeros(3, dtype=d) for i, d in enumerate(reversed(DTYPES))}, None),  # every dtype's place
        ({"b.w": torch.randn(2, 3), "a.w": torch.randn(1), "é\"x\\": torch.arange(3), "s": torch.tensor(1.5),
          "e": torch.zeros(0, 4)}, {"wte.weight": "lm_head.weight"}),  # odd names, a scalar, an empty tensor
        ({"x": torch.randn(5)}, None),  # header padding differs with the name's length
        ({"xy": torch.randn(5)}, {}),
        ({"lm_head.weight": torch.randn(7, 3), "wpe.weight": torch.randn(2, 3)}, {"wte.weight": "lm_head.weight"}),
    ],
)
def test_layout_is_safetensors_own(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> None:
    assert _filled(tensors, metadata) == save(tensors, metadata=metadata)


def test_metadata_entries_are_sorted() -> None:
    head = layout({"a": ((1,), torch.float32)}, {"z": "1", "b": "2"}).header
    assert head.index(b'"b"') < head.index(b'"z"')


def test_a_dtype_safetensors_cannot_store_is_named() -> None:
    with pytest.raises(UnsupportedDtype, match="q: safetensors has no dtype"):
        layout({"q": ((2,), torch.quint8)}, None)
