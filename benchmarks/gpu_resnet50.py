"""ResNet-50 on one GPU (bf16, channels_last): images/s of gputrain on synthetic data and on
JPEG files on disk, and of a hand-written loop on the same synthetic data.

Goals: from disk >= 95% of synthetic (the input pipeline keeps the GPU fed), and gputrain >= 1.0x
the hand-written loop. The image files are written once (Pillow, 256x256 JPEG, decoded and
centre-cropped to 224 by gputrain's image_folder source in DataLoader workers).

    python benchmarks/gpu_resnet50.py [--batch 256] [--steps 60] [--images 5120]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import gputrain_step_times, header, median, require_cuda, require_registered, time_windows

import torch
import torch.nn.functional as F

CLASSES = 10


def build(spec, seed: int):  # type: ignore[no-untyped-def]
    from gputrain.config.schema import ModelConfig
    from gputrain.models import build_model

    torch.manual_seed(seed)
    return build_model(ModelConfig(name="resnet50"), spec)


def write_images(root: Path, count: int) -> None:
    """`count` random 256x256 JPEGs in CLASSES class folders."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class{i % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(folder / f"{i}.jpg", quality=90)


def run_gputrain(model, data, spec, batch: int, steps: int, extra: dict) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    from gputrain import Trainer

    torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as run_dir:
        config = {"train.batch_size": batch, "train.max_steps": steps, "train.epochs": 10**6, "train.precision": "bf16",
                  "optim.name": "sgd", "optim.lr": 0.1, "log.every_steps": 5, "log.progress": "none",
                  "log.tensorboard": False, "checkpoint.enabled": False, "eval.every_epochs": 0, **extra}
        Trainer(model, data, spec=spec, config=config, run_dir=run_dir).fit()
        seconds = median(gputrain_step_times(Path(run_dir), skip_rows=2))
    return seconds, torch.cuda.max_memory_allocated()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--images", type=int, default=5120, help="JPEG files written for the from-disk run")
    args = parser.parse_args()
    device = require_cuda("gpu_resnet50")
    require_registered(model="resnet50", data="image_folder")
    from gputrain.config.schema import DataConfig
    from gputrain.data import build_data
    from gputrain.data.spec import DataSpec
    from gputrain.data.tensors import TensorData

    spec = DataSpec(task="classification", input_shape=(3, 224, 224), num_classes=CLASSES)
    generator = torch.Generator().manual_seed(0)
    synthetic = TensorData(torch.randn(args.batch * 4, 3, 224, 224, generator=generator),
                           torch.randint(0, CLASSES, (args.batch * 4,), generator=generator))

    # hand-written loop: same model, channels_last, bf16 autocast, fused SGD (as gputrain builds it on CUDA)
    model = build(spec, 0).to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.0, fused=True)
    images = synthetic.inputs.to(device).contiguous(memory_format=torch.channels_last)
    labels = synthetic.targets.to(device)
    position = 0

    def hand_step() -> None:
        nonlocal position
        idx = slice(position, position + args.batch)
        position = (position + args.batch) % len(images)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images[idx]), labels[idx])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.backends.cudnn.benchmark = True
    torch.cuda.reset_peak_memory_stats()
    hand = median(time_windows(hand_step, warmup=10, windows=5, per_window=max(1, (args.steps - 10) // 5)))
    hand_mem = torch.cuda.max_memory_allocated()
    del model, optimizer, images, labels
    torch.cuda.empty_cache()

    ours_syn, ours_syn_mem = run_gputrain(build(spec, 0), synthetic, spec, args.batch, args.steps, {})
    with tempfile.TemporaryDirectory() as folder:
        write_images(Path(folder), args.images)
        bundle = build_data(DataConfig(name="image_folder", path=folder, val_fraction=0.0, test_fraction=0.0,
                                       image_size=224), seed=0)
        ours_disk, ours_disk_mem = run_gputrain(build(bundle.spec, 0), bundle.train, bundle.spec, args.batch,
                                                args.steps, {})

    print(header(device))
    print(f"ResNet-50, bf16, channels_last, batch {args.batch}, SGD momentum 0.9")
    for name, seconds, mem in (("hand loop, synthetic", hand, hand_mem), ("gputrain, synthetic", ours_syn, ours_syn_mem),
                               ("gputrain, JPEG files", ours_disk, ours_disk_mem)):
        print(f"{name:22s} step {1000 * seconds:7.2f} ms  {args.batch / seconds:8,.0f} images/s  "
              f"peak memory {mem / 2**30:.2f} GiB")
    print(f"gputrain / hand (synthetic): step time {ours_syn / hand:.3f}, throughput {hand / ours_syn:.3f}, "
          f"memory {ours_syn_mem / hand_mem:.3f}")
    print(f"from disk / synthetic throughput: {ours_syn / ours_disk:.3f} (goal >= 0.95)")


if __name__ == "__main__":
    main()
