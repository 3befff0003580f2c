"""A small text corpus and the pipelines that convert it (shared by the library and CLI tests)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from tests._corpus import make_docs
from tests.ops._chat import CHATML_TAGGED, conversations

ROWS_PER_FILE = 120


def write_text_corpus(folder: Path, files: int = 2, rows: int = ROWS_PER_FILE) -> list[Path]:
    """``files`` JSON Lines files of ``rows`` documents each under ``folder/data``."""
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        path = data / f"part-{f}.jsonl"
        docs = make_docs(rows, seed=f)
        path.write_text("".join(json.dumps({"text": d["text"]}) + "\n" for d in docs))
        paths.append(path)
    return paths


def write_pipeline(
    folder: Path, tokenizer: str | os.PathLike[str] = "bytes", *, extra: str = ""
) -> Path:
    """A training pipeline over ``folder/data``: decode, tokenize, then packing and batching
    (which zephon convert leaves to the training run)."""
    path = folder / "pipeline.yaml"
    path.write_text(
        "datasets:\n  - {name: web, path: data}\n"
        f"operators:\n{extra}"
        "  - {op: decode_text}\n"
        f"  - {{op: tokenize, tokenizer: {json.dumps(os.fspath(tokenizer))}}}\n"
        "  - {op: pack_flat, max_length: 64, pad_token_id: 0}\n"
        "  - {op: batch, microbatch_size: 4}\n"
    )
    return path


WIDE_SPECIALS = {"<s>": 70_000, "</s>": 70_001, "<|im_start|>": 70_002, "<|im_end|>": 70_003}


def write_wide_special_tokenizer(folder: Path) -> Path:
    """A WordLevel tokenizer of a few tokens whose special ones (BOS, EOS, ChatML's) have ids
    from 70000: its vocabulary counts 7, yet those ids do not fit ``uint16``."""
    vocab = {"[UNK]": 0, "the": 1, "a": 2, **WIDE_SPECIALS}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(WIDE_SPECIALS))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def write_chat_pipeline(folder: Path, n: int = 40, tokenizer: str = "bytes") -> Path:
    """Conversations tokenized with loss masks on the assistant turns (chat SFT)."""
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "chats.jsonl").write_text(
        "".join(json.dumps(c) + "\n" for c in conversations(n, seed=3, tools=False))
    )
    (folder / "chatml.jinja").write_text(CHATML_TAGGED)
    path = folder / "pipeline.yaml"
    path.write_text(
        "datasets:\n  - {name: chat, path: data}\n"
        "operators:\n"
        f"  - {{op: tokenize_chat, tokenizer: {json.dumps(tokenizer)}, "
        "chat_template: chatml.jinja}\n"
    )
    return path


def tree_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative name (what byte-identical output compares)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }
