"""The entry rules every store applies at ``put``, before any I/O: one function, one error.

Why: a ``TokenEntry`` built directly is not type-checked, so an entry with float or bool token
ids used to be acknowledged, after which no reader could decode the rollout. A store may only
acknowledge what it can read back: the rules below are checked on the canonical bytes decoded
exactly as a reader decodes them, plus what the schema cannot express (id ranges, lengths).

The rules (the same for the memory, file, sqlite and postgres stores):

* ``rollout_id`` is a valid rollout id; ``model_call_id`` and ``parent_call_id`` are valid call
  ids (:func:`~zephon.capture.records.validate_call_id`: what postgres can hold as a key);
* log-probs and ``created_at`` are finite;
* the canonical bytes decode back into a ``TokenEntry``: token ids are integers (not floats,
  not bools), every field has its type, nesting is not too deep to read back;
* token ids lie in ``[0, MAX_TOKEN_ID]``;
* lengths agree: one log-prob per generated token, ``token_item_index`` inside
  ``output_items``, and ``cum_len`` (when set) is the prompt plus the generation (at least
  that for a delta prompt);
* values are in their domain: a log-prob is at most 0 (a probability is at most 1; a
  positive one is a logit or a sign error), and ``routed_experts`` is a list or null.
"""

from __future__ import annotations

import contextlib

from zephon.capture.records import (
    MAX_TOKEN_ID,
    TokenEntry,
    require_finite,
    validate_call_id,
    validate_rollout_id,
)

__all__ = ["admit_entry"]


def _refuse(entry: TokenEntry, problem: str) -> ValueError:
    return ValueError(
        f"rollout {entry.rollout_id!r} call {entry.model_call_id!r}: {problem}; the entry was "
        "not stored"
    )


def _read_back(entry: TokenEntry) -> tuple[bytes, TokenEntry]:
    """The canonical bytes and the entry a reader decodes from them, or the refusal."""
    try:
        canonical = entry.canonical_bytes()
        return canonical, TokenEntry.from_json(canonical)
    except RecursionError:
        raise _refuse(entry, "it is nested too deeply to be stored and read back") from None
    except TypeError as exc:
        raise _refuse(entry, f"it cannot be encoded as JSON ({exc})") from None
    except ValueError as exc:
        raise _refuse(entry, f"it would not read back ({exc})") from None


def _check_token_ids(entry: TokenEntry, ids: list[int], field: str) -> None:
    if ids and (min(ids) < 0 or max(ids) > MAX_TOKEN_ID):
        bad = next(i for i, x in enumerate(ids) if not 0 <= x <= MAX_TOKEN_ID)
        raise _refuse(entry, f"{field}[{bad}] is {ids[bad]}, outside [0, {MAX_TOKEN_ID}]")


def _check_lengths(entry: TokenEntry) -> None:
    if entry.cum_len is None:
        return
    own = len(entry.prompt_token_ids) + len(entry.generation_token_ids)
    if entry.prompt_is_delta and entry.cum_len < own:
        raise _refuse(
            entry, f"cum_len {entry.cum_len} is shorter than its own {own} prompt+generation"
        )
    if not entry.prompt_is_delta and entry.cum_len != own:
        raise _refuse(
            entry,
            f"cum_len is {entry.cum_len} but prompt_token_ids + generation_token_ids hold {own}",
        )


#: A log-prob above this is no log-probability (floating-point noise of a certain token
#: stays far below it).
MAX_LOG_PROB = 1e-3


def _check_domains(entry: TokenEntry) -> None:
    lps = entry.generation_log_probs
    if lps and max(lps) > MAX_LOG_PROB:
        bad = next(i for i, x in enumerate(lps) if x > MAX_LOG_PROB)
        raise _refuse(
            entry,
            f"generation_log_probs[{bad}] is {lps[bad]!r}; a log-prob is at most 0 (send the "
            "engine's logprobs, not logits or probabilities)",
        )
    experts = entry.routed_experts
    if experts is not None and not isinstance(experts, list):
        raise _refuse(
            entry,
            f"routed_experts is a {type(experts).__name__}; it must be a list (the experts "
            "each token was routed to, per layer) or null",
        )


def admit_entry(entry: TokenEntry) -> bytes:
    """Check ``entry`` against the put rules; its canonical bytes, or ``ValueError``."""
    validate_rollout_id(entry.rollout_id)
    validate_call_id(entry.model_call_id)
    if entry.parent_call_id is not None:
        validate_call_id(entry.parent_call_id, field="parent_call_id")
    with contextlib.suppress(TypeError):  # a log-prob not a number: the read-back names it
        require_finite(entry)
    canonical, back = _read_back(entry)
    _check_token_ids(entry, back.prompt_token_ids, "prompt_token_ids")
    _check_token_ids(entry, back.generation_token_ids, "generation_token_ids")
    _check_lengths(back)
    _check_domains(back)
    return canonical
