"""What a new user does with only the README and docs/, in a fresh temp dir:

1. run the demo (`zephon demo`, as `make demo` does);
2. write a YAML pipeline over their own JSONL folder (the docs/index.md config, pointed at it);
3. run it, stop it (`--max-batches`), resume it, and check the resumed run delivered exactly
   what an uninterrupted run delivers;
4. capture rollouts into a file:// store, inspect one, and train on them through a pipeline,
   running the python blocks of docs/capture-quickstart.md sections 2 and 5 as written;
5. the first hour's rough edges, each asserted: the demo's legend and closing lines, rate and
   ETA; a missing extra named (optional modules blocked); a tokenizer next to the YAML without
   a BOS (a config error naming the key, then a run with `special_tokens: eos`); a JSON array,
   a BOM and a null text field named as such; `explain` writing nothing; `checkpoint inspect`
   explaining its columns; help text and "did you mean" on the command line.

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


def sh_fails(*args: str, cwd: Path, code: int, env: dict[str, str] | None = None) -> str:
    """Run a command that must fail with ``code``; its last stderr line (the one-line error)."""
    print("$", " ".join(args), f"(expect exit {code})", flush=True)
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    lines = proc.stderr.strip().splitlines()
    if proc.returncode != code or not lines:
        sys.exit(f"expected exit {code}, got {proc.returncode}: {' '.join(args)}\n{proc.stderr}")
    return lines[-1]


def expect(text: str, *needles: str) -> None:
    """Every needle must be in ``text`` (the output a new user reads)."""
    for needle in needles:
        if needle not in text:
            sys.exit(f"expected {needle!r} in the output:\n{text}")


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

    # 1. the demo: the plan's legend, a rate and an ETA, and three closing lines
    shown = sh(ZEPHON, "demo", "--data", "demo-data", "--docs", "2000", "--shards", "4", cwd=work)
    expect(shown, "* added by the engine: fetch", "replay_filter", "docs/s", "eta ")
    expect(shown.strip().splitlines()[-1], "next: ", "zephon explain pipeline.yaml")

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
    shown = sh(ZEPHON, "checkpoint", "inspect", "ckpt", cwd=work)
    expect(
        shown,
        "restart: CHUNK:OFFSET a restore",
        "re-fetch: source records",
        "last cursor: CHUNK:OFFSET",
    )
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

    first_hour(work)
    print(f"walkthrough ok in {work}")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def first_hour(work: Path) -> None:
    """Step 5: each rough edge a new user met, with the output that now explains it."""
    missing_extra(work)
    own_tokenizer(work)
    bad_files(work)
    env = {**os.environ, "ZEPHON_CACHE_DIR": str(work / "fresh-cache")}
    subprocess.run([ZEPHON, "explain", "pipeline.yaml"], cwd=work, env=env, check=True,
                   capture_output=True)  # fmt: skip
    if (work / "fresh-cache").exists():
        sys.exit("zephon explain wrote into the cache folder")
    expect(sh(ZEPHON, "run", "--help", cwd=work), "--checkpoint-dir DIR", "write DIR/ckpt-")
    line = sh_fails(ZEPHON, "explain", "pipeline.yaml", "--fromat", "json", cwd=work, code=2)
    expect(line, "did you mean '--format'?")
    print("first hour ok: every message says what to do")


def missing_extra(work: Path) -> None:
    """A chat pipeline without jinja2 installed: one line naming the extra, exit 2."""
    (work / "chat.yaml").write_text(
        "datasets: [{name: d, path: my-corpus}]\n"
        "operators: [{op: tokenize_chat, tokenizer: bytes, chat_template: '{{ messages }}'}]\n"
    )
    core_only = str(ROOT / "tests" / "cli" / "_core_only.py")
    line = sh_fails(sys.executable, core_only, "run", "chat.yaml", cwd=work, code=2)
    expect(line, "needs jinja2, which is not installed: pip install 'zephon[chat]'")


def own_tokenizer(work: Path) -> None:
    """A locally trained BPE next to the YAML, run from elsewhere: no BOS is a config error
    naming the key; ``special_tokens: eos`` runs."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    project = work / "project"
    (project / "tok").mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = (work / "my-corpus" / "part-0.jsonl").read_text().splitlines()
    texts = [json.loads(line)["text"] for line in corpus]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]", "<|endoftext|>"], show_progress=False
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(project / "tok" / "tokenizer.json"))
    yaml_text = (
        f"datasets: [{{name: d, path: {work / 'my-corpus'}}}]\n"
        "operators: [decode_text, {op: tokenize, tokenizer: tok/tokenizer.json}]\n"
    )
    (project / "p.yaml").write_text(yaml_text)
    line = sh_fails(ZEPHON, "run", str(project / "p.yaml"), "--quiet", cwd=work, code=2)
    expect(line, "operators[1].special_tokens:", "defines no BOS token",
           "special_tokens: none | eos | bos_eos", "bos_token_id: ID")  # fmt: skip
    (project / "p.yaml").write_text(yaml_text.replace("json}", "json, special_tokens: eos}"))
    summary = json.loads(sh(ZEPHON, "run", str(project / "p.yaml"), "--json", "--quiet",
                            "--max-batches", "5", cwd=work))  # fmt: skip
    if summary["items"] != 5 or summary["tokens"] == 0:
        sys.exit(f"the own-tokenizer run delivered {summary}")


def bad_files(work: Path) -> None:
    """A JSON array, a BOM and a null text: each named as such, with file and line."""
    cases = {
        "array": (b'[\n  {"text": "a"},\n  {"text": "b"}\n]\n', "data.json, line 1: the file "
                  "is one JSON array, not JSON Lines"),
        "bom": (b'\xef\xbb\xbf{"text": "a"}\n', "data.json, line 1: the file starts with a "
                "UTF-8 byte order mark"),
        "null": (b'{"text": "a"}\n{"text": null}\n', "data.json, line 2: "),
    }  # fmt: skip
    for name, (data, message) in cases.items():
        folder = work / f"bad-{name}"
        folder.mkdir(exist_ok=True)
        (folder / "data.json").write_bytes(data)
        (folder / "p.yaml").write_text(
            "datasets: [{name: d, path: data.json}]\noperators: [decode_text, tokenize]\n"
        )
        line = sh_fails(ZEPHON, "run", "p.yaml", "--quiet", cwd=folder, code=1)
        expect(line, message)
        if name == "null":
            expect(line, "field 'text' of record (0, 0, 1) is null, expected str or bytes")


if __name__ == "__main__":
    sys.exit(main())
