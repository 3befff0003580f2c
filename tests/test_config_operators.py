"""Every built-in operator has one definition: the builder, the YAML schema and the docs table
all follow it, so a typo in any operator's keys gets "did you mean"."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from zephon import Pipeline, StaticMixtureWorkSource
from zephon.config import (
    OPERATORS,
    ConfigFileError,
    OperatorDefinition,
    operator_definitions,
    operators_markdown,
    parse_config,
)
from zephon.errors import ConfigError
from zephon.io import Dataset

DOCS = Path(__file__).resolve().parents[1] / "docs" / "yaml.md"
DEFINITIONS = operator_definitions()
PARAMETERS = [(d, p.name) for d in DEFINITIONS for p in d.parameters]


def _config(operator: dict[str, object]) -> dict[str, object]:
    return {"datasets": [{"name": "web", "path": "web.jsonl"}], "operators": [operator]}


def test_every_builder_operator_has_a_definition() -> None:
    assert [d.name for d in DEFINITIONS] == list(OPERATORS)
    assert len(DEFINITIONS) >= 14


@pytest.mark.parametrize(("definition", "param"), PARAMETERS, ids=lambda v: getattr(v, "name", v))
def test_a_typo_in_any_operator_key_gets_did_you_mean(
    definition: OperatorDefinition, param: str
) -> None:
    typo = param + param[-1]
    with pytest.raises(ConfigFileError) as err:
        parse_config(_config({"op": definition.name, typo: 1}))
    assert err.value.key == f"operators[0].{typo}"
    assert f"unknown parameter of {definition.name}; did you mean {param!r}?" in str(err.value)


def test_decode_text_typo_is_caught_by_yaml_and_by_the_builder() -> None:
    with pytest.raises(ConfigFileError, match=r"operators\[0\]\.feilds: .*did you mean 'fields'"):
        parse_config(_config({"decode_text": {"feilds": ["text"]}}))
    source = StaticMixtureWorkSource([Dataset.from_records("web", [{"text": "a"}])])
    with pytest.raises(ConfigError, match="decode_text: unknown parameter 'feilds'; did you mean"):
        Pipeline(source).decode_text(feilds=["text"])


def test_decode_text_keywords_are_checked_for_type() -> None:
    with pytest.raises(ConfigFileError, match=r"operators\[0\]\.lowercase: expected true/false"):
        parse_config(_config({"decode_text": {"lowercase": "yes"}}))
    config = parse_config(_config({"decode_text": {"fields": ["text"], "lowercase": True}}))
    assert config.operators[0].params == {"fields": ["text"], "lowercase": True}


@pytest.mark.parametrize("definition", DEFINITIONS, ids=lambda d: d.name)
def test_definition_holds_every_named_builder_parameter(definition: OperatorDefinition) -> None:
    signature = inspect.signature(getattr(Pipeline, definition.name))
    named = [
        n
        for n, p in signature.parameters.items()
        if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    assert definition.names()[: len(named)] == named


def test_docs_table_is_the_definitions() -> None:
    text = DOCS.read_text()
    found = re.search(r"<!-- operators:begin -->\n(.*?)<!-- operators:end -->", text, re.S)
    assert found is not None, "docs/yaml.md lost its operators table markers"
    assert found.group(1) == operators_markdown(), (
        "docs/yaml.md's operator table differs from zephon.config.operator_definitions(); "
        "replace it with zephon.config.operators_markdown()"
    )
