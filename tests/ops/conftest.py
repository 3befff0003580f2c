from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A locally trained tokenizer with chat special tokens and a ChatML template (tagged)."""
    from tests.ops._chat import CHATML_TAGGED, make_tokenizer_dir

    return make_tokenizer_dir(tmp_path_factory.mktemp("chat-tok"), CHATML_TAGGED)


@pytest.fixture(scope="session")
def hf_chat_tokenizer(chat_tokenizer_dir: Path) -> Any:
    """The same tokenizer as transformers loads it (from the local directory, offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(chat_tokenizer_dir))
