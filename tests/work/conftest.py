from __future__ import annotations

from tests.engine.conftest import hf_tokenizer_dir

__all__ = ["hf_tokenizer_dir"]
