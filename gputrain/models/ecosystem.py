"""What the models of outside libraries (timm, torchvision, transformers) share when gputrain builds them.

The libraries are optional (`python3 scripts/install.py --ecosystem`): each is imported only when a
config names one of its models, and a missing or broken one is a usage error whose hint is a command
that fixes it without replacing the installed torch (torch_builds.py).
Nothing here downloads: models start from random weights, or from local files (`model.weights`,
or the directory `model.hf_config` names).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from collections.abc import Iterable
from types import ModuleType

import torch
from torch import nn

from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError, first_line
from gputrain.torch_builds import libraries_install, torchvision_install, torchvision_series

_VISION = ("timm", "torchvision")
"""The libraries that need a torchvision built for the installed torch (timm imports it)."""


def install_hint(package: str) -> str:
    """The command that installs one library of the extra and keeps the installed torch (and a
    torchvision that imports): timm and transformers name both at their installed versions, so
    pip can neither swap torch nor pull a torchvision built for another one."""
    pinned = _working_torchvision()
    if pinned is None and package == "timm":  # the torchvision the hint installs first, kept by timm's install
        series = torchvision_series(torch.__version__)
        pinned = f"{series}.*" if series else None
    return libraries_install([package], torch.__version__, pinned)


def _working_torchvision() -> str | None:
    """The installed torchvision's version where it imports beside this torch, else None."""
    try:
        torchvision = importlib.import_module("torchvision")
    except Exception:  # noqa: BLE001 - not installed, or built for another torch
        return None
    return str(torchvision.__version__)


def torchvision_hint() -> str:
    """The command that gives this torch a torchvision that imports: installed from the index of
    this torch's build, after removing one built for another torch (pip would call it satisfied)."""
    broken = importlib.util.find_spec("torchvision") is not None and _working_torchvision() is None
    return torchvision_install(torch.__version__, broken=broken)


def import_library(module: str, model_name: str) -> ModuleType:
    """Import an optional library for `model.name=model_name`.

    Raises:
        ConfigError: the library is not installed, or installed but cannot be imported with this torch;
            the hint is a command that fixes it (torch_builds.py).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or module).split(".")[0]
        hint = install_hint(missing)
        # timm needs torchvision, which must be built for this torch: installed first, timm keeps it
        if module in _VISION and _working_torchvision() is None:
            hint = torchvision_hint() + ("" if missing == "torchvision" else f", then {hint}")
        raise ConfigError("model.name", f"needs {missing}, which is not installed", model_name, hint=hint) from exc
    except Exception as exc:  # a broken install, e.g. a torchvision built for another torch
        cause = f"({type(exc).__name__}: {first_line(exc, 10_000)})"
        if module in _VISION and _working_torchvision() is None:
            # the usual cause: a torchvision built for a CUDA torch beside a CPU one, whose C++ ops fail to load
            hint = f"install the torchvision built for this torch: {torchvision_hint()}"
        else:
            hint = f"reinstall it: python -m pip uninstall -y {module} && {install_hint(module)}"
        raise ConfigError(
            "model.name",
            f"needs {module}, which is installed but cannot be imported with torch {torch.__version__} {cause}",
            model_name,
            hint=hint,
        ) from exc


def check_known_name(name: str, known: Iterable[str], model_name: str, library: str) -> None:
    """Refuse a name the library does not have, with the closest one it does have.

    Raises:
        ConfigError: naming model.name.
    """
    names = sorted(known)
    if name in names:
        return
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    raise ConfigError(
        "model.name",
        f"{library} has no model {name!r} ({len(names)} models)",
        model_name,
        hint=f"did you mean {', '.join(repr(f'{library}:{c}') for c in close)}?" if close else None,
    )


def check_image_data(spec: DataSpec, model_name: str) -> int:
    """The channel count of the data's images, which an image model of a library needs.

    Raises:
        ConfigError: the data is not images with labels or targets.
    """
    if not spec.is_image or spec.task == "lm":
        raise ConfigError(
            "model.name",
            f"{model_name} needs image data (channels, height, width); this data gives "
            f"{spec.task} samples of shape {list(spec.input_shape)}",
            model_name,
            hint="use data.name=digits, mnist or image_folder, or model.name=hf for token sequences",
        )
    return spec.input_shape[0]


def larger_images_hint(spec: DataSpec) -> str:
    """What would give the model larger images: the field that sizes this data's images, or, where
    the source's size is fixed (digits 8×8, MNIST 28×28), the sources whose size is a field."""
    if spec.size_field is not None:
        return f"use larger images ({spec.size_field}) or another model"
    size = "×".join(map(str, spec.input_shape[1:]))
    return (
        f"this data's images are {size} whatever the config: use another model, or data that sets its size "
        "(data.name=image_folder with data.image_size, synthetic with data.shape)"
    )


def check_takes_images(model: nn.Module, spec: DataSpec, model_name: str) -> None:
    """Run two blank images of the data's shape through the model in training mode, so a model that
    cannot take this size (a ViT's patches larger than the image, too many stride-2 stages) or that
    returns something else than one row of outputs per image is refused now, naming the sizes,
    rather than failing at step 1. Parameters are shared, buffers copied and the RNG state kept, so
    the model is exactly as built afterwards (BatchNorm statistics and dropout draws untouched)."""
    images = torch.zeros(2, *spec.input_shape)
    state: dict[str, torch.Tensor] = dict(model.named_parameters())
    state.update({name: t.clone() for name, t in model.named_buffers()})
    shape = "×".join(str(n) for n in spec.input_shape)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = torch.func.functional_call(model, state, (images,))
    except Exception as exc:  # the model's own message says why, in its terms
        raise ConfigError(
            "model.name",
            f"cannot take this data's {shape} images ({type(exc).__name__}: {first_line(exc)})",
            model_name,
            hint=larger_images_hint(spec),
        ) from exc
    expected = (2, spec.num_model_outputs)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = f"a tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(
            "model.name",
            f"returns {got} for 2 images, not the {expected[1]} outputs per image the data needs",
            model_name,
        )
