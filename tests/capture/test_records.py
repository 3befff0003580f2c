"""TokenEntry and ledger records: golden vectors from NeMo Gym 0.7.0, validation, round trips."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import msgspec
import pytest

from zephon.capture.records import (
    CallRecord,
    CaptureRecordError,
    EngineRefusalRecord,
    ParentResolutionStatus,
    RolloutManifest,
    TokenEntry,
    canonical_json,
    compute_digest,
    cumulative_tokens,
    encode_token_ids,
    validate_capture_keys,
    validate_rollout_id,
)
from zephon.errors import ZephonError

GOLDEN = json.loads(
    (pathlib.Path(__file__).parent / "fixtures" / "golden_vectors.json").read_text()
)


def _ids(spec: Any) -> list[int]:
    return spec if isinstance(spec, list) else list(range(spec["range"]))


@pytest.mark.parametrize("vector", GOLDEN["digests"], ids=lambda v: str(v["digest"][:8]))
def test_compute_digest_matches_nemo_gym(vector: dict[str, Any]) -> None:
    ids = _ids(vector["token_ids"])
    assert compute_digest(ids) == vector["digest"]
    if vector["encoded_hex"] is not None:
        assert encode_token_ids(ids).hex() == vector["encoded_hex"]


def test_empty_digest_hashes_the_tag_alone() -> None:
    # The quirk: encode_token_ids([]) has a header, the digest of [] does not use it.
    assert encode_token_ids([]) == bytes([1]) + bytes(8)
    assert compute_digest([]) == GOLDEN["digests"][0]["digest"]


@pytest.mark.parametrize("bad", [[-1], [2**64], [1.5]])
def test_digest_refuses_invalid_token_ids(bad: list[Any]) -> None:
    with pytest.raises(ValueError, match="token ids"):
        compute_digest(bad)


@pytest.mark.parametrize("vector", GOLDEN["entries"], ids=lambda v: v["input"]["rollout_id"])
def test_canonical_bytes_match_nemo_gym(vector: dict[str, Any]) -> None:
    want = vector["canonical"].encode()
    from_dict = TokenEntry.from_dict(vector["input"])
    from_json = TokenEntry.from_json(json.dumps(vector["input"]))
    from_canonical = TokenEntry.from_json(want)
    for entry in (from_dict, from_json, from_canonical):
        assert entry.canonical_bytes() == want
    if vector["cumulative_digest"] is not None:
        assert compute_digest(cumulative_tokens(from_dict)) == vector["cumulative_digest"]


def test_manifest_wire_matches_nemo_gym() -> None:
    manifest = RolloutManifest.from_wire(GOLDEN["manifest"])
    assert canonical_json(manifest) == GOLDEN["manifest_canonical"].encode()
    assert manifest.to_wire() == GOLDEN["manifest"]


def test_unknown_fields_are_preserved_and_cannot_shadow_known_ones() -> None:
    raw = GOLDEN["entries"][2]["input"]
    entry = TokenEntry.from_json(json.dumps(raw))
    assert entry.extra_fields == {
        "zz_unknown_field": {"b": 1, "a": [1.5, None, True]},
        "aa_unknown": "kept",
    }
    assert entry.to_dict()["aa_unknown"] == "kept"
    copy = entry.with_changes(model="m2")
    assert copy.extra_fields == entry.extra_fields and copy.model == "m2"
    with pytest.raises(ValueError, match="collide"):
        entry._set_extra({"model": "x"})


def test_large_float_exponents_use_nemo_gym_format() -> None:
    # msgspec writes 1e22; NeMo Gym (orjson) writes 1e+22; strings must stay untouched.
    assert canonical_json([1e22, -1.5e17, 1e-7, "a:5e5", {"k": 2.5e16}]) == (
        b'[1e+22,-1.5e+17,1e-7,"a:5e5",{"k":2.5e+16}]'
    )
    entry = TokenEntry.from_dict({**GOLDEN["entries"][0]["input"], "created_at": 1e20})
    assert b'"created_at":1e+20' in entry.canonical_bytes()


def _base(**kw: Any) -> dict[str, Any]:
    return {**GOLDEN["entries"][0]["input"], **kw}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cum_len": "x"}, "$.cum_len"),
        ({"prompt_token_ids": ["a"]}, "$.prompt_token_ids"),
        ({"generation_log_probs": [0.0]}, "generation_log_probs"),
        ({"schema_version": 2}, "schema_version"),
        ({"schema_version": 0}, "schema_version"),
        ({"token_item_index": 0}, "token_item_index"),
        ({"parent_resolution": "resolved"}, "parent_call_id"),
        ({"parent_resolution": "root", "parent_call_id": "p"}, "parent_call_id"),
        ({"parent_resolution": "unresolved", "parent_call_id": "p"}, "parent_call_id"),
        ({"parent_resolution": "maybe"}, "parent_resolution"),
        ({"prompt_is_delta": True}, "prompt_is_delta"),
        ({"model_call_id": ""}, "model_call_id"),
        ({"rollout_id": 3}, "$.rollout_id"),
        ({"weight_version": -1}, "weight_version"),
        ({"weight_version": 2**63}, "weight_version"),
        ({"weight_version": [3]}, "weight_version"),
    ],
)
def test_validation_errors_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("$", r"\$")):
        TokenEntry.from_dict(_base(**change))
    with pytest.raises(ValueError, match=field.replace("$", r"\$")):
        TokenEntry.from_json(json.dumps(_base(**change)))


def test_a_weight_version_round_trips_and_an_unset_one_leaves_the_bytes_alone() -> None:
    golden = GOLDEN["entries"][0]
    entry = TokenEntry.from_dict({**golden["input"], "weight_version": 7})
    assert entry.canonical_bytes().endswith(b',"weight_version":7}')
    assert TokenEntry.from_json(entry.canonical_bytes()).weight_version == 7
    assert entry.to_dict()["weight_version"] == 7
    unset = entry.with_changes(weight_version=None)
    assert unset.canonical_bytes() == golden["canonical"].encode()
    assert "weight_version" not in unset.to_dict()
    tagged = unset.with_extra_fields(zephon_group={"id": "g", "index": 0, "size": 2})
    assert b"weight_version" not in tagged.canonical_bytes()


@pytest.mark.parametrize("bad", ["0", [0], 1.0, True])
def test_a_misshaped_token_item_index_is_a_record_error_naming_the_field(bad: Any) -> None:
    with pytest.raises(CaptureRecordError, match=r"^token_item_index: must be an integer") as info:
        TokenEntry(
            rollout_id="r",
            model_call_id="c",
            prompt_token_ids=[1],
            generation_token_ids=[2],
            generation_log_probs=[-0.5],
            output_items=[{"type": "message"}, {"type": "message"}],
            token_item_index=bad,
        )
    assert info.value.field == "token_item_index"
    assert isinstance(info.value, ZephonError) and isinstance(info.value, ValueError)


def test_missing_required_field_is_named() -> None:
    data = _base()
    del data["generation_token_ids"]
    with pytest.raises(ValueError, match="generation_token_ids"):
        TokenEntry.from_dict(data)


def test_python_construction_coerces_numbers_like_nemo_gym() -> None:
    entry = TokenEntry(
        rollout_id="r",
        model_call_id="c",
        prompt_token_ids=[1],
        generation_token_ids=[2],
        generation_log_probs=[0],  # type: ignore[list-item]
        created_at=5,  # type: ignore[arg-type]
        parent_resolution="root",  # type: ignore[arg-type]
    )
    assert entry.parent_resolution is ParentResolutionStatus.ROOT
    assert b'"created_at":5.0' in entry.canonical_bytes()
    assert b'"generation_log_probs":[0.0]' in entry.canonical_bytes()


def test_cumulative_tokens_refuses_delta_records() -> None:
    entry = TokenEntry.from_dict(GOLDEN["entries"][3]["input"])
    with pytest.raises(ValueError, match="delta"):
        cumulative_tokens(entry)


def test_malformed_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="malformed"):
        TokenEntry.from_json(b'{"rollout_id": ')


def test_call_record_rules_name_the_field() -> None:
    base = GOLDEN["manifest"]["records"][0]
    CallRecord(**{k: v for k, v in base.items()})
    cases = {
        "cum_len": {"cum_len": 5},
        "mode": {"parent_call_id": "p", "prev_len": 2, "cum_len": 6},
        "digest": {"digest": "A" * 64},
        "response_id": {"response_id": ""},
        "weight_version": {"weight_version": -1},
        "admitted_at": {"admitted_at": float("nan")},
    }
    for field, change in cases.items():
        with pytest.raises(ValueError, match=field):
            msgspec.convert({**base, **change}, CallRecord)
    with pytest.raises(ValueError, match="unknown_field"):
        RolloutManifest.from_wire({**GOLDEN["manifest"], "unknown_field": 1})


def test_engine_refusal_record_rules() -> None:
    rec = EngineRefusalRecord(model_call_id="c", code="x", parent_resolution="root")  # type: ignore[arg-type]
    assert rec.parent_resolution is ParentResolutionStatus.ROOT
    with pytest.raises(ValueError, match="parent_call_id"):
        EngineRefusalRecord(
            model_call_id="c", code="x", parent_resolution=ParentResolutionStatus.RESOLVED
        )
    with pytest.raises(ValueError, match="code"):
        EngineRefusalRecord(model_call_id="c", code="")


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "é", ".", "..", "x" * 201, 5])
def test_rollout_ids_are_restricted(bad: Any) -> None:
    with pytest.raises(ValueError, match="rollout_id"):
        validate_rollout_id(bad)


def test_capture_keys_validated_as_a_batch() -> None:
    assert validate_capture_keys(["a", "b", "a"]) == ["a", "b"]
    assert validate_capture_keys("a") == ["a"]
    with pytest.raises(ValueError, match="capture key #1"):
        validate_capture_keys(["ok", "not ok"])
