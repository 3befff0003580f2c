"""What a new user does with only the README and docs/, in a fresh temp dir:

1. run the demo (`zephon demo`, as `make demo` does);
2. write a YAML pipeline over their own JSONL folder (the docs/index.md config, pointed at it);
3. run it, stop it (`--max-batches`), resume it, and check the resumed run delivered exactly
   what an uninterrupted run delivers;
4. capture rollouts into a file:// store, inspect one, and train on them through a pipeline,
   running the python blocks of docs/capture-quickstart.md sections 2 and 5 as written.

Uses the installed `zephon` command. Exit code 0 when every step worked.
Usage: python scripts/new_user_walkthrough.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
ZEPHON = shutil.which("zephon", path=_PATH)


def sh(*args: str, cwd: Path) -> str:
    print("$", " ".join(args), flush=True)
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        cmd = " ".join(args)
        sys.exit(f"step failed ({proc.returncode}): {cmd}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def blocks(page: str, lang: str) -> list[str]:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", type=Path, default=None, help="work here instead of a temp dir")
    args = parser.parse_args()
    if ZEPHON is None:
        sys.exit("the `zephon` command is not installed (pip install -e . or make demo)")
    work = args.keep or Path(tempfile.mkdtemp(prefix="zephon-walkthrough-"))
    work.mkdir(parents=True, exist_ok=True)

    # 1. the demo
    sh(ZEPHON, "demo", "--data", "demo-data", "--docs", "2000", "--shards", "4", cwd=work)

    # 2. my own JSONL folder and the quick start's YAML pointed at it
    own = work / "my-corpus"
    own.mkdir(exist_ok=True)
    for shard in range(3):
        with open(own / f"part-{shard}.jsonl", "w", encoding="utf-8") as fh:
            for i in range(1000):
                words = " ".join(f"w{(i * 7 + k) % 97}" for k in range(5 + (i % 80)))
                fh.write(json.dumps({"id": f"{shard}-{i}", "text": words}) + "\n")
    (yaml_text,) = blocks("index.md", "yaml")
    (work / "pipeline.yaml").write_text(yaml_text.replace("path: my-data", "path: my-corpus"))
    sh(ZEPHON, "explain", "pipeline.yaml", cwd=work)

    # 3. run, stop, resume; compare with an uninterrupted run
    sh(ZEPHON, "run", "pipeline.yaml", "--checkpoint-dir", "ckpt", "--max-batches", "20",
       "--record", "resumed.jsonl", cwd=work)  # fmt: skip
    sh(ZEPHON, "run", "pipeline.yaml", "--checkpoint-dir", "ckpt", "--resume",
       "--record", "resumed.jsonl", cwd=work)  # fmt: skip
    sh(ZEPHON, "checkpoint", "inspect", "ckpt", cwd=work)
    sh(ZEPHON, "run", "pipeline.yaml", "--record", "straight.jsonl", "--quiet", cwd=work)
    resumed = (work / "resumed.jsonl").read_text()
    if resumed != (work / "straight.jsonl").read_text() or resumed.count("\n") <= 20:
        sys.exit("stop + resume did not deliver exactly the uninterrupted run")
    print(f"resume ok: {resumed.count(chr(10))} items, identical to the uninterrupted run")

    # 4. capture rollouts and train on them, as docs/capture-quickstart.md shows
    snippets = blocks("capture-quickstart.md", "python")
    capture_code, train_code = snippets[0], snippets[1]
    (work / "capture.py").write_text(capture_code)
    sh(sys.executable, "capture.py", cwd=work)
    store = (work / "capture").as_uri()
    shown = sh(ZEPHON, "capture", "inspect", "episode-1", "--store", store, "--json", cwd=work)
    if json.loads(shown)["masked"] or sum(json.loads(shown)["loss_mask"]) == 0:
        sys.exit("the captured rollout was masked")
    setup = capture_code.replace("asyncio.run(capture_rollouts())", "")
    (work / "train.py").write_text(setup + "\n" + train_code)
    sh(sys.executable, "train.py", cwd=work)
    print(f"walkthrough ok in {work}")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
