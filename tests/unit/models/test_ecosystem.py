"""Outside libraries' models, the parts that need none of them: the config's checks of model.name,
the install hints when a library is missing or broken, model.weights, and the image probe."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from gputrain.cli import main
from gputrain.config import load_config
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models import build_model
from gputrain.models.ecosystem import check_takes_images, import_library
from gputrain.models.weights import load_weights

IMAGES = DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=10)


# ---------------------------------------------------------------- model.name in the config (no torch needed)
@pytest.mark.parametrize("name", ["timm:resnet18", "timm:resnet18.a1_in1k", "torchvision:mobilenet_v3_small"])
def test_library_names_pass_the_config(name: str) -> None:
    assert load_config(None, [f"model.name={name}"]).model.name == name


@pytest.mark.parametrize("name, message", [
    ("timmm:resnet18", "config error: model.name = 'timmm:resnet18': unknown library 'timmm'; models from a "
                       "library are named timm:<name>, torchvision:<name>\n  did you mean 'timm:resnet18'?"),
    ("timm:", "config error: model.name = 'timm:': timm:<name> takes a model name of letters, digits, '_', '-' "
              "and '.'\n  e.g. timm:resnet18"),
    ("timm:hf-hub:timm/resnet18.a1_in1k", "hub repositories are not downloaded"),
    ("torchvision:org/model", "hub repositories are not downloaded"),
    # the library forms are named beside a close match too: timm's and torchvision's resnets are there
    ("resnt18", "choose from cnn, gpt, hf, mlp, resnet18, resnet34, resnet50, or a library's model: timm:<name>, "
                "torchvision:<name>, or hf with model.hf_config\n  did you mean 'resnet18'?"),
    ("efficientnet", "or a library's model: timm:<name>, torchvision:<name>, or hf with model.hf_config"),
])
def test_bad_model_names_are_refused_with_the_form(name: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"model.name={name}"])
    assert message in str(info.value)


def test_hf_needs_its_config_file() -> None:
    with pytest.raises(ConfigError, match=r"^config error: model.hf_config: model.name=hf needs"):
        load_config(None, ["model.name=hf"])
    assert load_config(None, ["model.name=hf", "model.hf_config=cfg.json"]).model.hf_config == "cfg.json"


# ---------------------------------------------------------------- a missing or broken library: a command that fixes it
CPU_TORCH = "2.13.0+cpu"
CPU_VISION = ("python -m pip install 'torchvision==0.28.*' 'torch==2.13.0+cpu' "
              "--index-url https://download.pytorch.org/whl/cpu")


@pytest.fixture
def cpu_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", CPU_TORCH)


def _broken_torchvision(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A torchvision installed but built for another torch: found, and its import fails as PyPI's
    CUDA build does beside a CPU torch."""
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)


def _message(module: str) -> str:
    with pytest.raises(ConfigError) as info:
        import_library(module, f"{module}:x")
    return str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="needs a machine without torchvision")
@pytest.mark.parametrize(("module", "hint"), [
    # torchvision from the CPU index, beside the installed torch: pip can neither swap torch nor call it satisfied
    ("torchvision", CPU_VISION),
    # timm after it, with torch and that torchvision series pinned: timm's own dependency cannot pull PyPI's
    ("timm", f"{CPU_VISION}, then python -m pip install timm 'torch==2.13.0+cpu' 'torchvision==0.28.*'"),
    # transformers needs no torchvision: none is named, so none is pulled
    ("transformers", "python -m pip install transformers 'torch==2.13.0+cpu'"),
])
def test_missing_library_gets_a_command_that_keeps_the_cpu_torch(
    monkeypatch: pytest.MonkeyPatch, cpu_torch: None, module: str, hint: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ModuleNotFoundError
    message = _message(module)
    assert f"needs {module}, which is not installed" in message
    assert message.endswith("\n  " + hint)
    # pip would resolve the extra to the newest torchvision, and a CUDA torch with it
    assert "gputrain[ecosystem]" not in message


@pytest.mark.parametrize("module", ["torchvision", "timm"])
def test_a_torchvision_built_for_another_torch_is_uninstalled_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_torch: None, module: str
) -> None:
    _broken_torchvision(monkeypatch, tmp_path)
    if module == "timm":  # timm imports torchvision first: the same failure
        (tmp_path / "timm").mkdir()
        (tmp_path / "timm" / "__init__.py").write_text("import torchvision\n")
        monkeypatch.delitem(sys.modules, "timm", raising=False)
    message = _message(module)
    assert "installed but cannot be imported with torch 2.13.0+cpu (RuntimeError: operator torchvision::nms" in message
    # installing over it would print "Requirement already satisfied" and change nothing
    assert message.endswith(f"install the torchvision built for this torch: python -m pip uninstall -y torchvision "
                            f"&& {CPU_VISION}")


def test_a_cuda_torch_gets_its_own_index_and_pypis_torch_gets_pypi(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrain.torch_builds import torchvision_install

    monkeypatch.setitem(sys.modules, "torchvision", None)
    for version, tail in [("2.9.1+cu128", " --index-url https://download.pytorch.org/whl/cu128"), ("2.13.0", "")]:
        monkeypatch.setattr(torch, "__version__", version)
        series = f"0.{int(version.split('.')[1]) + 15}"
        expected = f"python -m pip install 'torchvision=={series}.*' 'torch=={version}'{tail}"
        assert _message("torchvision").endswith(expected)
    assert torchvision_install("3.0.0") == "python -m pip install torchvision 'torch==3.0.0'"  # no series known: pip's


def test_broken_library_is_named_with_its_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    package = tmp_path / "brokenlib"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        import_library("brokenlib", "timm:resnet18")
    assert "installed but cannot be imported" in str(info.value)
    assert "(RuntimeError: operator torchvision::nms does not exist)" in str(info.value)
    assert "python -m pip uninstall -y brokenlib && python -m pip install brokenlib 'torch==" in str(info.value)


def test_cli_exits_2_when_the_library_is_missing(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "timm", None)
    code = main(["train", "model.name=timm:resnet18", "train.device=cpu", "--run-dir", str(tmp_path / "run")])
    assert code == 2
    assert "model.name = 'timm:resnet18': needs timm, which is not installed" in capsys.readouterr().err


# ---------------------------------------------------------------- model.weights
def _cnn(num_classes: int = 10, **overrides: object) -> nn.Module:
    config = load_config(None, {"model.name": "cnn", **{f"model.{k}": v for k, v in overrides.items()}})
    return build_model(config.model, DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=num_classes))


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_weights_are_loaded_after_the_init(tmp_path: Path, suffix: str) -> None:
    torch.manual_seed(0)
    source = _cnn()
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        save_file(source.state_dict(), str(path))
    else:  # a training script's checkpoint: the state dict inside, with DDP's prefix
        torch.save({"model": {f"module.{k}": v for k, v in source.state_dict().items()}, "epoch": 3}, path)
    torch.manual_seed(1)
    loaded = _cnn(weights=str(path), init="orthogonal")  # the init runs first and must not overwrite them
    for name, tensor in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_an_output_layer_of_another_size_stays_new(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = _cnn(num_classes=1000)  # e.g. ImageNet weights, fine-tuned on 10 classes
    save_file(source.state_dict(), str(tmp_path / "w.safetensors"))
    loaded = _cnn(num_classes=10, weights=str(tmp_path / "w.safetensors"))
    assert loaded.state_dict()["head.3.weight"].shape == (10, 128)
    for name, tensor in source.state_dict().items():
        if not name.startswith("head.3."):
            assert torch.equal(loaded.state_dict()[name], tensor), name


def test_tied_weights_saved_once_load(tmp_path: Path) -> None:
    from safetensors.torch import save_model

    spec = DataSpec(task="lm", input_shape=(8,), vocab_size=16)
    config = load_config(None, {"model.name": "gpt", "model.n_layer": 1, "model.n_head": 2, "model.d_model": 8})
    torch.manual_seed(0)
    source = build_model(config.model, spec)
    save_model(source, str(tmp_path / "gpt.safetensors"))  # the shared embedding/head stored under one name
    loaded = build_model(dataclass_replace(config.model, weights=str(tmp_path / "gpt.safetensors")), spec)
    assert torch.equal(loaded.lm_head.weight, source.lm_head.weight)
    assert loaded.lm_head.weight is loaded.wte.weight


def dataclass_replace(config, **changes):  # type: ignore[no-untyped-def]
    import dataclasses

    return dataclasses.replace(config, **changes)


@pytest.mark.parametrize("make_file, message", [
    (lambda p, m: None, "model.weights = '{path}': no such file"),
    (lambda p, m: save_file({k: v for k, v in m.state_dict().items() if k != "features.0.bias"}, str(p)),
     "does not fit this model: the model has features.0.bias, which the file lacks"),
    (lambda p, m: save_file({**m.state_dict(), "extra.weight": torch.zeros(1)}, str(p)),
     "the file has extra.weight, which the model lacks"),
    (lambda p, m: save_file({**m.state_dict(), "features.0.weight": torch.zeros(32, 3, 3, 3)}, str(p)),
     "features.0.weight has shape [32, 3, 3, 3] in the file and [32, 1, 3, 3] in the model"),
    (lambda p, m: p.write_bytes(b"not a tensor file"), "cannot be read as safetensors or a torch state dict"),
])
def test_weights_that_do_not_fit_are_refused(tmp_path: Path, make_file, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "w.safetensors"
    make_file(path, _cnn())
    with pytest.raises(ConfigError) as info:
        load_weights(_cnn(), str(path))
    assert message.format(path=path) in str(info.value)


class Payload:
    """Unpickling this would run code: weights_only=True refuses it."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (print, ("code ran",))


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    torch.save({"model": _cnn().state_dict(), "payload": Payload()}, tmp_path / "w.pt")
    with pytest.raises(ConfigError, match="cannot be read as safetensors or a torch state dict"):
        load_weights(_cnn(), str(tmp_path / "w.pt"))
    assert "code ran" not in capsys.readouterr().out


# ---------------------------------------------------------------- the image probe
def test_image_probe_leaves_the_model_as_built() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.5), nn.Flatten(), nn.LazyLinear(10))
    model(torch.randn(2, 1, 8, 8))  # materialise the lazy layer
    model[1].running_mean.fill_(0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    check_takes_images(model, DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=10), "x")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # BatchNorm statistics kept
    assert torch.equal(torch.get_rng_state(), rng)  # dropout drew from a forked generator


def test_image_probe_refuses_too_small_images_and_wrong_outputs() -> None:
    pooled_away = nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(8), nn.Flatten(), nn.Linear(4, 10))
    with pytest.raises(ConfigError, match=r"cannot take this data's 1×8×8 images \(RuntimeError: "):
        check_takes_images(pooled_away, IMAGES, "torchvision:x")
    wrong_width = nn.Sequential(nn.Flatten(), nn.Linear(64, 1000))
    with pytest.raises(ConfigError, match=r"returns a tensor of shape \[2, 1000\] for 2 images, not the 10 outputs"):
        check_takes_images(wrong_width, IMAGES, "torchvision:x")


@pytest.mark.parametrize("size_field, hint", [
    (None, "this data's images are 8×8 whatever the config: use another model, or data that sets its size "
           "(data.name=image_folder with data.image_size, synthetic with data.shape)"),  # digits, MNIST
    ("data.shape", "use larger images (data.shape) or another model"),  # synthetic
    ("data.image_size", "use larger images (data.image_size) or another model"),  # image_folder
])
def test_too_small_images_name_the_field_that_sizes_them(size_field: str | None, hint: str) -> None:
    spec = DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=10, size_field=size_field)
    pooled_away = nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(8), nn.Flatten(), nn.Linear(4, 10))
    with pytest.raises(ConfigError) as info:
        check_takes_images(pooled_away, spec, "timm:x")
    assert str(info.value).splitlines()[-1] == f"  {hint}"


def test_each_data_source_names_the_field_that_sizes_its_samples(tmp_path: Path) -> None:
    from gputrain.data import build_data

    fields = {}
    for name in ("digits", "synthetic"):
        fields[name] = build_data(load_config(None, {"data.name": name}).data, seed=0).spec.size_field
    assert fields == {"digits": None, "synthetic": "data.shape"}
