"""ResNet-50 on one GPU (bf16, channels_last): images/s of gputrain on synthetic data and on
JPEG files on disk, and of a hand-written loop on the same synthetic data.

Goals: from disk >= 95% of synthetic (the input pipeline keeps the GPU fed), and gputrain >= 1.0x
the hand-written loop. The image files are written once (Pillow, 256x256 JPEG, decoded and
centre-cropped to 224 by gputrain's image_folder source in DataLoader workers).

    python benchmarks/gpu_resnet50.py [--batch 256] [--steps 60] [--images 5120]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from _common import gputrain_step_times, header, median, peak_memory, require_cuda, require_registered, time_windows

import torch
import torch.nn.functional as F

CLASSES = 10


@dataclasses.dataclass(frozen=True)
class ResnetJob:
    """One measured configuration (gpu_proof.py --dry-run shrinks every size)."""

    device: torch.device
    batch: int = 256
    steps: int = 60
    warmup: int = 10
    images: int = 5120
    """JPEG files written for the from-disk run."""
    image_size: int = 224
    model: str = "resnet50"


def spec_of(job: ResnetJob):  # type: ignore[no-untyped-def]
    from gputrain.data.spec import DataSpec

    return DataSpec(task="classification", input_shape=(3, job.image_size, job.image_size), num_classes=CLASSES)


def build(job: ResnetJob, spec, seed: int = 0):  # type: ignore[no-untyped-def]
    from gputrain.config.schema import ModelConfig
    from gputrain.models import build_model

    torch.manual_seed(seed)
    return build_model(ModelConfig(name=job.model), spec)


def synthetic_data(job: ResnetJob):  # type: ignore[no-untyped-def]
    from gputrain.data.tensors import TensorData

    generator = torch.Generator().manual_seed(0)
    n, size = job.batch * 4, job.image_size
    return TensorData(torch.randn(n, 3, size, size, generator=generator),
                      torch.randint(0, CLASSES, (n,), generator=generator))


def write_images(root: Path, count: int, size: int = 256) -> None:
    """`count` random size x size JPEGs in CLASSES class folders, encoded on 8 threads (Pillow's
    encoder releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from PIL import Image

    for c in range(CLASSES):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)

    def write(i: int) -> None:
        pixels = np.random.default_rng(i).integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"class{i % CLASSES}" / f"{i}.jpg", quality=90)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(count)))


def run_hand_loop(job: ResnetJob, synthetic) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Same model, channels_last, bf16 autocast, fused SGD (as gputrain builds it on CUDA), the
    batches already on the device: {"step_s", "peak_memory_bytes"}."""
    device = job.device
    # channels_last where gputrain uses it: on CUDA (on a CPU, bf16 convolutions in it are slow)
    layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    model = build(job, spec_of(job)).to(device).to(memory_format=layout)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.0,
                                fused=device.type == "cuda")
    images = synthetic.inputs.to(device).contiguous(memory_format=layout)
    labels = synthetic.targets.to(device)
    position = 0

    def hand_step() -> None:
        nonlocal position
        idx = slice(position, position + job.batch)
        position = (position + job.batch) % len(images)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images[idx]), labels[idx])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.backends.cudnn.benchmark = True
    peak_memory(reset=True)
    per_window = max(1, (job.steps - job.warmup) // 5)
    seconds = median(time_windows(hand_step, warmup=job.warmup, windows=5, per_window=per_window))
    return {"step_s": seconds, "peak_memory_bytes": peak_memory()}


def run_gputrain(job: ResnetJob, model, data, spec, extra: dict | None = None) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """{"step_s", "peak_memory_bytes", "summary"} of a gputrain run of `model` on `data`."""
    from gputrain import Trainer

    peak_memory(reset=True)
    with tempfile.TemporaryDirectory() as run_dir:
        config = {"train.batch_size": job.batch, "train.max_steps": job.steps, "train.epochs": 10**6,
                  "train.precision": "bf16", "train.device": str(job.device), "optim.name": "sgd", "optim.lr": 0.1,
                  "log.every_steps": 5, "log.progress": "none", "log.tensorboard": False,
                  "checkpoint.enabled": False, "eval.every_epochs": 0, **(extra or {})}
        summary = Trainer(model, data, spec=spec, config=config, run_dir=run_dir).fit()
        skip = min(2, max(0, job.steps // 5 - 1))  # cudnn autotuning and warm-up windows
        seconds = median(gputrain_step_times(Path(run_dir), skip_rows=skip))
    return {"step_s": seconds, "peak_memory_bytes": peak_memory(), "summary": summary}


def run_from_disk(job: ResnetJob, extra: dict | None = None) -> dict[str, Any]:
    """gputrain on JPEG files it writes to a temporary folder first (image_folder, decoded in workers)."""
    from gputrain.config.schema import DataConfig
    from gputrain.data import build_data

    with tempfile.TemporaryDirectory() as folder:
        write_images(Path(folder), job.images, size=job.image_size * 8 // 7)  # 256 for 224: resize + crop
        bundle = build_data(DataConfig(name="image_folder", path=folder, val_fraction=0.0, test_fraction=0.0,
                                       image_size=job.image_size), seed=0)
        return run_gputrain(job, build(job, bundle.spec), bundle.train, bundle.spec, extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--images", type=int, default=5120, help="JPEG files written for the from-disk run")
    args = parser.parse_args()
    job = ResnetJob(require_cuda("gpu_resnet50"), batch=args.batch, steps=args.steps, images=args.images)
    require_registered(model="resnet50", data="image_folder")
    synthetic = synthetic_data(job)
    hand = run_hand_loop(job, synthetic)
    torch.cuda.empty_cache()
    ours = run_gputrain(job, build(job, spec_of(job)), synthetic, spec_of(job))
    disk = run_from_disk(job)

    print(header(job.device))
    print(f"ResNet-50, bf16, channels_last, batch {job.batch}, SGD momentum 0.9")
    for name, run in (("hand loop, synthetic", hand), ("gputrain, synthetic", ours), ("gputrain, JPEG files", disk)):
        print(f"{name:22s} step {1000 * run['step_s']:7.2f} ms  {job.batch / run['step_s']:8,.0f} images/s  "
              f"peak memory {run['peak_memory_bytes'] / 2**30:.2f} GiB")
    print(f"gputrain / hand (synthetic): step time {ours['step_s'] / hand['step_s']:.3f}, throughput "
          f"{hand['step_s'] / ours['step_s']:.3f}, memory {ours['peak_memory_bytes'] / hand['peak_memory_bytes']:.3f}")
    print(f"from disk / synthetic throughput: {ours['step_s'] / disk['step_s']:.3f} (goal >= 0.95)")


if __name__ == "__main__":
    main()
