"""Extract fenced code blocks from the Markdown pages of docs/ (see docs/index.md, "How the
examples are tested", for the convention this enforces)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")
FILE_MARK = re.compile(r"^<!--\s*file:\s*(\S+)\s*-->$")
RUN = {"python": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
DATA = {"yaml": "yaml", "json": "json"}
SHOWN = {"text": "text"}
KINDS = {**RUN, **DATA, **SHOWN}


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    kind: str  # python | shell | yaml | json | text | unknown
    code: str
    file: str | None  # write the block to this file (yaml/json/text with <!-- file: X -->)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        start = i
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence):
            j += 1
        if j >= len(lines):
            raise ValueError(f"{path}:{start + 1}: code block is never closed")
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        mark = FILE_MARK.match(lines[prev].strip()) if prev >= 0 else None
        out.append(
            Block(
                page=f"docs/{path.name}",
                line=start + 1,
                lang=lang,
                kind=KINDS.get(lang, "unknown"),
                code="\n".join(lines[start + 1 : j]) + "\n",
                file=mark.group(1) if mark else None,
            )
        )
        i = j + 1
    return out
