"""Image decode + resize: zephon's ``decode_image`` on threads against a plain Pillow loop (the
ceiling) and a torch DataLoader with worker processes, on the same 512x512 JPEGs.

The corpus: ``--images`` JPEGs (512x512, quality 90, a smooth gradient with noise, like a
photo) in WebDataset tar shards of 100 samples, plus one corrupt JPEG (cut in half). Every
contender decodes to RGB, resizes to the Qwen2-VL size (504x504, bicubic) and makes a uint8
array:

- ``PIL loop (ceiling)``: the encoded bytes held in memory, ``Image.open`` + ``convert`` +
  ``resize`` + ``np.asarray`` on one thread. No loader can do more per core.
- ``zephon threads``: ``Dataset.from_path`` over the tar shards -> ``decode_image()`` with
  ``--workers`` threads (bytes read from the shards, records shuffled, the corrupt image
  skipped and quarantined by ``on_error="skip"``).
- ``torch DataLoader``: a map-style dataset over the in-memory bytes, ``num_workers=--workers``
  processes, ``batch_size=None``.

images/s is wall time; CPU/image is user+system CPU of the process and its children over the
images delivered, so "per core" compares CPU/image. Peak RSS: zephon in a fresh process over
the corpus and over one four times larger (``--images`` and 4x): it must not grow with it.

Usage: ``python benchmarks/multimodal.py [--images 400] [--workers N] [--repeats 3]``.
Prints a table and one final JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zephon import Pipeline, StaticMixtureWorkSource
from zephon.io import Dataset

SIDE = 512
TARGET = (504, 504)  # smart_resize(512, 512) with Qwen2-VL's defaults
PER_SHARD = 100


def jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    base = np.stack([x * 0.4 + i, y * 0.3 + 2 * i, (x + y) * 0.2], axis=-1)
    pixels = (base + rng.normal(0, 6, base.shape)).clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=90)
    return out.getvalue()


def write_corpus(folder: Path, images: int) -> list[bytes]:
    """``images`` JPEGs plus one corrupt one, as WebDataset tar shards; returns the bytes."""
    folder.mkdir(parents=True)
    distinct = [jpeg(i) for i in range(min(images, 64))]  # encoding is not what is measured
    data = [distinct[i % len(distinct)] for i in range(images)]
    data.insert(images // 2, distinct[0][: len(distinct[0]) // 2])
    for s in range(0, len(data), PER_SHARD):
        with tarfile.open(folder / f"shard-{s // PER_SHARD:05d}.tar", "w") as tar:
            for i, blob in enumerate(data[s : s + PER_SHARD], start=s):
                info = tarfile.TarInfo(f"{i:07d}.jpg")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    return data


def decode(blob: bytes) -> np.ndarray | None:
    try:
        with Image.open(io.BytesIO(blob)) as opened:
            picture = opened.convert("RGB").resize(TARGET, Image.Resampling.BICUBIC)
            return np.asarray(picture, dtype=np.uint8)
    except OSError:
        return None  # the corrupt one: skipped


def pil_loop(data: list[bytes], workers: int) -> int:
    return sum(decode(blob) is not None for blob in data)


def zephon_threads(folder: Path, workers: int) -> int:
    ds = Dataset.from_path("images", folder)
    source = StaticMixtureWorkSource([ds], chunk_size=64, seed=0, shuffle_within_shard=True)
    pipe = (
        Pipeline(source)
        .decode_image(parallelism=workers)
        .options(runner="threads", on_error="skip", fuse=False)
    )
    count = sum(r.payload["jpg"].shape == (*TARGET, 3) for r in pipe)
    assert pipe.last_stats is not None and pipe.last_stats.skipped == 1
    return count


class _Images:
    def __init__(self, data: list[bytes]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        return decode(self.data[i])


def dataloader(data: list[bytes], workers: int) -> int:
    from torch.utils.data import DataLoader

    loader = DataLoader(_Images(data), batch_size=None, num_workers=workers, collate_fn=lambda x: x)
    return sum(x is not None for x in loader)


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(run: Callable[[], int]) -> tuple[float, float, int]:
    """(images/s, CPU seconds per image, images) of one run."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    images = run()
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    return images / wall, cpu / images, images


def peak_rss_mib(folder: Path, workers: int) -> float:
    """Peak RSS of zephon decoding ``folder`` in a fresh process."""
    code = (
        "import resource, sys; sys.path.insert(0, sys.argv[3]);"
        "from benchmarks.multimodal import zephon_threads; from pathlib import Path;"
        "zephon_threads(Path(sys.argv[1]), int(sys.argv[2]));"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", code, str(folder), str(workers), root],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout.split()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small, large = Path(tmp) / "small", Path(tmp) / "large"
        data = write_corpus(small, args.images)
        runs: dict[str, Callable[[], int]] = {
            "PIL loop (ceiling)": lambda: pil_loop(data, 1),
            "zephon threads": lambda: zephon_threads(small, args.workers),
            "torch DataLoader": lambda: dataloader(data, args.workers),
        }
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in runs}
        for _ in range(args.repeats):  # interleaved rounds: load drifts hit every contender
            for name, run in runs.items():
                results[name].append(measure(run))
        write_corpus(large, 4 * args.images)
        rss = {"corpus": peak_rss_mib(small, args.workers)}
        rss["corpus_x4"] = peak_rss_mib(large, args.workers)
    print(f"{args.images} JPEGs {SIDE}x{SIDE} -> {TARGET[0]}x{TARGET[1]}, "
          f"{args.workers} workers, median of {args.repeats}")  # fmt: skip
    print(f"{'contender':<22}{'images/s':>10}{'CPU ms/image':>14}{'per core vs ceiling':>21}")
    summary: dict[str, Any] = {}
    ceiling_cpu = statistics.median(r[1] for r in results["PIL loop (ceiling)"])
    for name, rows in results.items():
        rate = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        print(f"{name:<22}{rate:>10.1f}{cpu * 1e3:>14.2f}{ceiling_cpu / cpu:>20.2f}x")
        summary[name] = {"images_per_s": round(rate, 1), "cpu_ms_per_image": round(cpu * 1e3, 3),
                         "per_core_vs_ceiling": round(ceiling_cpu / cpu, 3),
                         "images": rows[0][2]}  # fmt: skip
    print(f"peak RSS of zephon: {rss['corpus']:.0f} MiB ({args.images} images), "
          f"{rss['corpus_x4']:.0f} MiB ({4 * args.images} images)")  # fmt: skip
    print(json.dumps({"benchmark": "multimodal", "images": args.images, "workers": args.workers,
                      "results": summary, "peak_rss_mib": {k: round(v, 1) for k, v in rss.items()},
                      "corrupt_skipped": 1}))  # fmt: skip


if __name__ == "__main__":
    main()
