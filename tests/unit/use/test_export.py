"""gputrain export: every format is run against the eager model before it is kept, and a damaged
artifact fails that verification."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from gputrain.cli import main
from gputrain.errors import RunError
from gputrain.use.export import ExportOptions, verify_export
from tests.unit.use.conftest import needs_onnx


def _export(run_dir: Path, fmt: str, out: Path, *extra: str) -> dict:
    assert main(["export", str(run_dir), "--format", fmt, "-o", str(out), *extra]) == 0
    return json.loads((out / "export.json").read_text())


def _reseal(out: Path) -> None:
    """Record the files' checksums again, as after a re-export: the damage must then fail the numeric
    verification (an unsealed change is refused before loading: tests/adversarial/test_artifact_trust.py)."""
    from gputrain.use.export_files import record_checksums

    record = json.loads((out / "export.json").read_text())
    record["checksums"] = record_checksums(out, record["checksums"])
    (out / "export.json").write_text(json.dumps(record))


def _checks(record: dict) -> dict:
    assert record["verification"]["passed"] is True
    return record["verification"]["checks"]


@pytest.mark.parametrize("damage", [lambda w: w + 0.5, lambda w: float("nan")], ids=["changed", "nan"])
def test_safetensors_is_verified_bitwise_and_fails_once_a_weight_changes(tiny_run, tmp_path, capsys, damage) -> None:
    out = tmp_path / "st"
    record = _export(tiny_run("csv_mlp"), "safetensors", out)
    check = _checks(record)["safetensors"]
    assert (check["max_abs_diff"], check["atol"], check["rtol"]) == (0.0, 0.0, 0.0)
    assert record["input"]["meaning"] == "feature columns a, b, c" and record["output"]["classes"] == [
        "cat",
        "dog",
        "eel",
    ]
    assert {"model.safetensors", "config.toml", "spec.json", "preprocess.json", "export.json"} <= {
        p.name for p in out.iterdir()
    }
    assert "max abs diff 0" in capsys.readouterr().out
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0]  # the tensors follow the JSON header
    data[start : start + 4] = struct.pack("<f", damage(struct.unpack("<f", data[start : start + 4])[0]))
    weights.write_bytes(bytes(data))
    _reseal(out)
    with pytest.raises(RunError, match="safetensors: max abs diff"):
        verify_export(out, ExportOptions("safetensors"))
    assert json.loads((out / "export.json").read_text())["verification"]["passed"] is False


def test_pt2_takes_any_batch_and_sequence_length_and_fails_once_a_weight_changes(tiny_run, tmp_path) -> None:
    out = tmp_path / "pt2"
    record = _export(tiny_run("text_gpt"), "pt2", out, "--aoti", "off")
    check = _checks(record)["pt2"]
    n = record["verification"]["samples"]
    assert check["batches"] == [[n, 16], [1, 16], [n, 8]] and record["dynamic"] == ["batch", "seq"]
    assert check["max_abs_diff"] <= check["atol"] + check["rtol"] and record["aoti"]["file"] is None
    program = torch.export.load(out / "model.pt2")
    name = next(k for k in program.state_dict if k.endswith("ln_f.weight"))
    with torch.no_grad():
        program.state_dict[name].mul_(1.5)
    torch.export.save(program, out / "model.pt2")
    _reseal(out)
    with pytest.raises(RunError, match="pt2: max abs diff"):
        verify_export(out, ExportOptions("pt2"))


@pytest.mark.slow
def test_pt2_is_aot_compiled_and_the_package_verified_too(tiny_run, tmp_path) -> None:
    record = _export(tiny_run("csv_regression"), "pt2", tmp_path / "aoti", "--aoti", "on")
    checks = _checks(record)
    assert set(checks) == {"pt2", "pt2-aoti"} and record["files"][:2] == ["model.pt2", "model-aoti.pt2"]
    assert checks["pt2-aoti"]["runtime"] == "AOTInductor" and checks["pt2-aoti"]["passed"]
    (tmp_path / "aoti" / "model-aoti.pt2").write_bytes(b"not a package")
    _reseal(tmp_path / "aoti")
    with pytest.raises(RunError, match="pt2-aoti: it does not run"):
        verify_export(tmp_path / "aoti", ExportOptions("pt2"))


@needs_onnx
def test_onnx_takes_uint8_images_with_the_normalisation_inside_and_is_checked_by_onnx_runtime(
    tiny_run, tmp_path
) -> None:
    import onnx
    from onnx import numpy_helper

    out = tmp_path / "onnx"
    record = _export(tiny_run("images_resnet"), "onnx", out)
    check = _checks(record)["onnx"]
    assert (
        record["opset"] == 18
        and check["runtime"].startswith("onnxruntime")
        and "CPUExecutionProvider" in check["runtime"]
    )
    assert record["input"]["dtype"] == "uint8" and record["input"]["shape"] == ["batch", 3, 16, 16]
    model = onnx.load(out / "model.onnx")
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # a named, dynamic batch dimension
    assert model.opset_import[0].version == 18
    weight = max(model.graph.initializer, key=lambda t: len(numpy_helper.to_array(t).ravel()))
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    onnx.save(model, out / "model.onnx")
    _reseal(out)
    with pytest.raises(RunError, match="onnx: max abs diff"):
        verify_export(out, ExportOptions("onnx"))


@needs_onnx
def test_onnx_of_a_language_model_has_a_dynamic_sequence(tiny_run, tmp_path) -> None:
    record = _export(tiny_run("tokens_gpt"), "onnx", tmp_path / "lm")
    n = record["verification"]["samples"]
    assert _checks(record)["onnx"]["batches"] == [[n, 16], [1, 16], [n, 8]]


def test_onnx_without_the_extra_says_how_to_install_it(tiny_run, monkeypatch, capsys) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert main(["export", str(tiny_run("csv_mlp")), "--format", "onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs onnxruntime, not installed: pip install 'gputrain[export]'" in err and len(err.splitlines()) == 1


def test_a_model_torch_export_cannot_capture_is_a_usage_error_naming_what_can(tiny_run, monkeypatch, capsys) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("data-dependent control flow\nmore detail")

    monkeypatch.setattr(torch.export, "export", refuse)
    assert main(["export", str(tiny_run("csv_mlp")), "--format", "pt2", "--aoti", "off"]) == 2
    err = capsys.readouterr().err.strip()
    assert "torch.export cannot capture this model (data-dependent control flow); --format safetensors can" in err


def test_verify_only_needs_an_export(tmp_path, capsys) -> None:
    assert main(["export", str(tmp_path), "--format", "pt2", "--verify-only", "-o", str(tmp_path)]) == 2
    assert "no export.json" in capsys.readouterr().err
