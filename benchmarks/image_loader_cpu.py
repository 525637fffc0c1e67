"""How many images per second the image_folder pipeline delivers from JPEG files on this machine.

It writes N photo-sized JPEGs (500×375, like an average ImageNet image) into a temporary folder,
then times one epoch of the DataLoader gputrain builds for `data.name=image_folder` at
`data.image_size=224`: decode, resize and crop in the workers, collate, and hand over to the
main process. That is the rate a GPU can be fed from disk. Compare it with the model's
images/s on synthetic data: ResNet-50 in bf16 trains at roughly 2,500–3,000 images/s on one
H100, so the loader needs that many.

    python benchmarks/image_loader_cpu.py [--images 1024] [--workers 2] [--batch 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_jpegs(root: Path, n: int, classes: int = 8) -> None:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (375, 500, 3), dtype=np.uint8)  # one noisy photo, shifted per file
    for i in range(n):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.roll(base, i * 7, axis=1)).save(folder / f"{i}.jpg", quality=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from torch.utils.data import DataLoader

    from gputrain.config import load_config
    from gputrain.data import build_data

    with tempfile.TemporaryDirectory() as tmp:
        write_jpegs(Path(tmp), args.images)
        config = load_config({"data.name": "image_folder", "data.path": tmp, "data.image_size": 224,
                              "data.val_fraction": 0.0, "data.test_fraction": 0.0})
        train = build_data(config.data, seed=0).train
        loader = DataLoader(train, batch_size=args.batch, num_workers=args.workers, persistent_workers=True,
                            prefetch_factor=4)
        rates = []
        for r in range(args.repeats + 1):  # the first epoch starts the workers and is dropped
            start = time.perf_counter()
            count = 0
            for images, _ in loader:
                count += len(images)
            if r:
                rates.append(count / (time.perf_counter() - start))
        first = train[0][0]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU(s), {args.workers} worker(s), {time.strftime('%Y-%m-%d')}")
    print(f"image_folder, 500×375 JPEG → 224×224, batch {args.batch}: {np.median(rates):,.0f} images/s "
          f"({np.median(rates) / args.workers:,.0f} per worker); samples are {first.dtype} {tuple(first.shape)}, "
          f"{first.element_size() * first.numel() / 1024:.0f} KiB each")


if __name__ == "__main__":
    main()
