"""Exact token data out of an engine answer (vLLM / SGLang OpenAI-compatible shapes).

Priority, per call: the generated ids from ``choices[0].token_ids`` (vLLM ``return_token_ids``),
cross-checked against the ids the log-prob entries name when those are ``token_id:<int>``;
otherwise the log-prob entries' ids alone. The prompt ids from ``prompt_token_ids`` (top level
for chat, per choice or top level for completions); when absent, the caller asks the engine's
``/tokenize`` route. Anything partial (ids without log-probs, lengths that disagree, two sources
that disagree, a non-finite log-prob) raises :class:`TokenDataError`: a half-captured call must
mask the rollout, never train on a guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from zephon.errors import ZephonError

__all__ = [
    "GenerationTokens",
    "TokenDataError",
    "choice_of",
    "extract_generation",
    "prompt_ids_of",
]

_TOKEN_ID_PREFIX = "token_id:"


class TokenDataError(ZephonError, ValueError):
    """The engine's answer lacks exact token data or carries an inconsistent part of it."""


@dataclass(frozen=True, slots=True)
class GenerationTokens:
    token_ids: list[int]
    log_probs: list[float]


def _ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(type(x) is int and x >= 0 for x in value):
        raise TokenDataError(f"{where} must be a list of non-negative integers")
    return value


def choice_of(answer: dict[str, Any], index: int = 0, n: int = 1) -> dict[str, Any]:
    """Choice ``index`` of an answer that must hold exactly ``n`` (the request's ``n``)."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != n:
        got = len(choices) if isinstance(choices, list) else "no"
        raise TokenDataError(f"engine answer has {got} choices; the request asked for n={n}")
    by_index = [c for c in choices if isinstance(c, dict) and c.get("index", 0) == index]
    if n == 1 and isinstance(choices[0], dict):
        by_index = [choices[0]]
    if len(by_index) != 1:
        raise TokenDataError(f"engine answer has {len(by_index)} choices with index {index}")
    return by_index[0]


def _raw_logprobs(logprobs: dict[str, Any], chat: bool) -> tuple[Any, Any] | None:
    """``(values, tokens)`` as the chat or completions answer spells them, or None."""
    if chat:
        content = logprobs.get("content")
        if content is None:
            return None
        if not isinstance(content, list) or not all(isinstance(e, dict) for e in content):
            raise TokenDataError("choices[0].logprobs.content must be a list of objects")
        return [e.get("logprob") for e in content], [e.get("token") for e in content]
    values = logprobs.get("token_logprobs")
    tokens = logprobs.get("tokens")
    if values is None:
        return None
    if not isinstance(values, list) or not isinstance(tokens, list | None):
        raise TokenDataError("choices[0].logprobs.token_logprobs/tokens must be lists")
    return values, tokens


def _token_ids(tokens: list[Any]) -> list[int] | None:
    """The ids the entries name (``token_id:<n>``), or None when any entry names none."""
    parsed: list[int] = []
    for t in tokens:
        if not (isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX)):
            return None
        digits = t[len(_TOKEN_ID_PREFIX) :]
        if not digits.isdigit():
            raise TokenDataError(f"log-prob token {t!r} does not name a token id")
        parsed.append(int(digits))
    return parsed


def _logprob_entries(
    choice: dict[str, Any], chat: bool
) -> tuple[list[float] | None, list[int] | None]:
    """(log-probs, ids named by the entries or None) of one choice."""
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return None, None
    if not isinstance(logprobs, dict):
        raise TokenDataError("choices[0].logprobs must be an object")
    raw = _raw_logprobs(logprobs, chat)
    if raw is None:
        return None, None
    values, tokens = raw
    lps: list[float] = []
    for i, v in enumerate(values):
        if type(v) not in (float, int) or not math.isfinite(v):
            raise TokenDataError(f"log-prob #{i} is {v!r}; every generated token needs a number")
        lps.append(float(v))
    ids = _token_ids(tokens) if tokens is not None and len(tokens) == len(lps) and tokens else None
    return lps, ids


def extract_generation(
    answer: dict[str, Any], *, chat: bool, index: int = 0, n: int = 1
) -> GenerationTokens:
    """Generated ids and their log-probs of choice ``index`` of a chat or completions answer."""
    choice = choice_of(answer, index, n)
    raw_ids = choice.get("token_ids")
    ids = None if raw_ids is None else _ids(raw_ids, "choices[0].token_ids")
    lps, lp_ids = _logprob_entries(choice, chat)
    if ids is None:
        ids = lp_ids
    if ids is None:
        raise TokenDataError(
            "engine answer carries no generated token ids: run an engine that honours "
            "return_token_ids (vLLM >= 0.10.2) or return_tokens_as_token_ids"
        )
    if lps is None:
        raise TokenDataError(
            f"engine answer has {len(ids)} generated token ids but no log-probs (partial token "
            "data); the engine must honour logprobs"
        )
    if len(lps) != len(ids):
        raise TokenDataError(
            f"engine answer has {len(ids)} generated token ids but {len(lps)} log-probs"
        )
    if lp_ids is not None and lp_ids != ids:
        first = next(i for i, (a, b) in enumerate(zip(ids, lp_ids)) if a != b)
        raise TokenDataError(
            f"choices[0].token_ids and the log-prob tokens disagree at position {first} "
            f"({ids[first]} vs {lp_ids[first]})"
        )
    return GenerationTokens(ids, lps)


def prompt_ids_of(
    answer: dict[str, Any], *, chat: bool, index: int = 0, n: int = 1
) -> list[int] | None:
    """The prompt ids the engine reports (for choice ``index``), or None when it reports none."""
    raw = answer.get("prompt_token_ids")
    if raw is None and not chat:
        raw = choice_of(answer, index, n).get("prompt_token_ids")
    if raw is None:
        return None
    return _ids(raw, "prompt_token_ids")
