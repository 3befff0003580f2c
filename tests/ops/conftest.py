from __future__ import annotations

from tests.engine.conftest import docs, hf_tokenizer_dir

__all__ = ["docs", "hf_tokenizer_dir"]
