"""Padding of image-caption rows: ``pack_sequences`` over text + vision tokens into 4,096-token
rows, planned from image headers (``image_tokens``, nothing decoded).

The corpus: ``--samples`` captions, each with 1-4 images (uniform) of random sides in
200..1200 pixels (PNG, a flat colour: only the header is read, so content does not matter) and
10..200 caption tokens. Images are sized with Qwen2-VL's ``smart_resize`` under
``max_pixels = 256 * 28 * 28`` (at most 256 vision tokens an image, a common training
setting), so a sample holds about 100..1,200 tokens.

Padding = 1 - tokens in rows / (rows x 4,096), over every row including the last partial ones.
Reported for ``first_fit`` and ``best_fit`` (16 open bins), uncapped and with
``max_images_per_row`` 16 (about what fits by tokens) and 8 (binding: rows run out of images
before tokens), and for the vision-balanced mode: ``max_vision_tokens_per_row`` at 3,600,
3,500 and 3,400 (the vision encoder's work per row capped near the uncapped rows' mean).
Next to the padding: the rows' vision tokens (mean, max) and their spread (standard deviation
/ mean), the figure the cap evens out.

Usage: ``python benchmarks/multimodal_packing.py [--samples 4000] [--seed 0]``. Prints a table
and one final JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.types import TAG_PACKING

ROW = 4096
MAX_PIXELS = 256 * 28 * 28


def corpus(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        record: dict[str, Any] = {"id": i, "input_ids": list(range(rng.randint(10, 200)))}
        for j in range(rng.randint(1, 4)):
            size = (rng.randint(200, 1200), rng.randint(200, 1200))
            out = io.BytesIO()
            Image.new("L", size, (i + j) % 256).save(out, "PNG", compress_level=1)
            record[f"image{j}"] = out.getvalue()
        rows.append(record)
    return rows


def measure(rows: list[dict[str, Any]], **pack: Any) -> dict[str, Any]:
    source = StaticMixtureWorkSource([Dataset.from_records("captions", rows)], chunk_size=64)
    pipe = (
        Pipeline(source)
        .image_tokens(fields=[f"image{j}" for j in range(4)], max_pixels=MAX_PIXELS)
        .pack_sequences(ROW, image_grids="image_grid_thw", **pack)
        .options(runner="threads")
    )
    start = time.perf_counter()
    used = packed_rows = samples = images = 0
    most_images = 0
    vision: list[int] = []
    for record in pipe:
        used += record.meta.tags[TAG_PACKING]["total_length"]
        packed_rows += 1
        samples += len(record.payload["packed_samples"])
        row_images = len(record.payload["image_map"])
        images += row_images
        most_images = max(most_images, row_images)
        vision.append(int(record.payload["image_map"][:, 3].sum()))
    seconds = time.perf_counter() - start
    return {
        **pack,
        "rows": packed_rows,
        "samples": samples,
        "images": images,
        "most_images_in_a_row": most_images,
        "padding": round(1 - used / (packed_rows * ROW), 4),
        "vision_mean": round(statistics.fmean(vision), 1),
        "vision_max": max(vision),
        "vision_spread": round(statistics.pstdev(vision) / statistics.fmean(vision), 4),
        "seconds": round(seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = corpus(args.samples, args.seed)
    caps: list[dict[str, int]] = [{}, {"max_images_per_row": 16}, {"max_images_per_row": 8}]
    caps += [{"max_vision_tokens_per_row": v} for v in (3600, 3500, 3400)]
    results = [
        measure(rows, algorithm=algorithm, **cap)
        for cap in caps
        for algorithm in ("first_fit", "best_fit")
    ]
    print(
        f"{'algorithm':<10} {'cap':>14} {'rows':>6} {'images':>7} {'max/row':>7} "
        f"{'padding':>8} {'vision mean':>11} {'max':>5} {'spread':>7}"
    )
    for r in results:
        cap = next((f"{k.split('_')[1]}<={v}" for k, v in r.items() if k.startswith("max_")), "-")
        print(
            f"{r['algorithm']:<10} {cap:>14} {r['rows']:>6} {r['images']:>7} "
            f"{r['most_images_in_a_row']:>7} {r['padding']:>8.2%} {r['vision_mean']:>11} "
            f"{r['vision_max']:>5} {r['vision_spread']:>7.2%}"
        )
    print(json.dumps({"samples": args.samples, "row": ROW, "results": results}))


if __name__ == "__main__":
    main()
