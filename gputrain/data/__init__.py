"""Data registry and sources (digits, csv, synthetic, ...), splits and loaders."""

from gputrain.data.registry import DataBundle, available_data, build_data, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import TensorData

__all__ = ["DataBundle", "DataSpec", "TensorData", "available_data", "build_data", "register_data"]
