"""Find a tokenizer's chat template and special-token strings, offline, without transformers.

``chat_template`` may be the template text, a ``.jinja`` file, a ``tokenizer_config.json`` or
``None`` (then: the tokenizer's own, from ``chat_template.jinja`` or ``tokenizer_config.json``
beside its ``tokenizer.json``, or a transformers instance's ``chat_template``). Named template
lists (``[{"name": "default", "template": ...}, ...]``) resolve to ``"default"``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError

NAME = "tokenize_chat"


def _tokenizer_dir(spec: Any) -> Path | None:
    if isinstance(spec, str | os.PathLike) and spec != "bytes":
        path = Path(spec)
        return path if path.is_dir() else path.parent
    return None


def _read_config(directory: Path | None) -> dict[str, Any]:
    if directory is None:
        return {}
    cfg = directory / "tokenizer_config.json"
    if not cfg.is_file():
        return {}
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{NAME}: {cfg} is not valid JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def _pick(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default") if len(named) > 1 else next(iter(named.values()), None)
        if isinstance(chosen, str):
            return chosen
        raise ConfigError(
            f"{NAME}: {where} holds templates {sorted(map(str, named))} but none is named "
            "'default'; pass chat_template=<the template text> to choose one"
        )
    raise ConfigError(f"{NAME}: {where} has no usable chat_template (got {type(value).__name__})")


def _from_file(path: Path) -> str:
    if path.suffix == ".json":
        data = _read_config(path.parent) if path.name == "tokenizer_config.json" else None
        if data is None:
            data = json.loads(path.read_text(encoding="utf-8"))
        if "chat_template" not in data:
            raise ConfigError(f"{NAME}: {path} has no 'chat_template' entry")
        return _pick(data["chat_template"], str(path))
    return path.read_text(encoding="utf-8")


def template_source(chat_template: str | os.PathLike[str] | None, tokenizer: Any) -> str:
    """The Jinja source to render (see the module docstring)."""
    if chat_template is not None:
        text = os.fspath(chat_template)
        if "{" not in text and Path(text).is_file():
            return _from_file(Path(text))
        if "{" not in text:
            raise ConfigError(
                f"{NAME}: chat_template {text!r} is neither a template (no '{{{{' or '{{%') nor "
                "an existing .jinja / tokenizer_config.json file"
            )
        return text
    directory = _tokenizer_dir(tokenizer)
    if directory is not None and (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text(encoding="utf-8")
    config = _read_config(directory)
    if "chat_template" in config:
        return _pick(config["chat_template"], f"{directory}/tokenizer_config.json")
    own = getattr(tokenizer, "chat_template", None)
    if own is not None:
        return _pick(own, type(tokenizer).__name__)
    raise ConfigError(
        f"{NAME}: no chat template found for tokenizer {tokenizer!r}; pass chat_template= "
        "(the Jinja text, a .jinja file or a tokenizer_config.json holding one)"
    )


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(tokenizer: Any) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ... as strings, as templates expect them."""
    mapping = getattr(tokenizer, "special_tokens_map", None)
    if not isinstance(mapping, dict):
        mapping = _read_config(_tokenizer_dir(tokenizer))
    out: dict[str, str] = {}
    for key, value in mapping.items():
        if isinstance(key, str) and key.endswith("_token"):
            text = _token_text(value)
            if text is not None:
                out[key] = text
    return out
