"""A YAML pipeline whose source is a streaming capture source, with the group operators."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.capture._rl_loop import GROUP
from tests.capture._stream_fill import fill
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource
from zephon.config import ConfigFileError, load_config, parse_config

PROMPTS = 6


def _rows(pipe: Any) -> list[tuple[int, list[tuple[str, float]]]]:
    return [
        (r.payload["position"], [(m["rollout_id"], m["reward"]) for m in r.payload["members"]])
        for r in pipe
    ]


@pytest.mark.parametrize("runner", ["inline", "process"])
def test_a_capture_stream_source_in_yaml_serves_what_the_python_pipeline_does(
    tmp_path: Path, runner: str
) -> None:
    python_url, yaml_url = (tmp_path / "py").as_uri(), (tmp_path / "yaml").as_uri()
    fill(python_url, PROMPTS, "grpo")
    fill(yaml_url, PROMPTS, "grpo")
    config_file = tmp_path / "rl.yaml"
    config_file.write_text(
        f"""
source:
  kind: capture_stream
  store: yaml                  # a file store's folder, relative to this file
  stream: grpo
  groups_per_step: 2
  max_staleness: 1
  prompts: {PROMPTS}
operators:
  - op: drop_equal_rewards
    store: yaml
  - {{op: keep_per_prompt, store: {yaml_url}, k: 1}}
runner: {runner}
""",
        encoding="utf-8",
    )
    config = load_config(config_file)
    assert config.source_kind == "capture_stream" and config.datasets == []
    assert config.summary()["source"] == "capture_stream"
    got = _rows(config.build())
    store = open_store(python_url)
    source = StreamingCaptureSource(
        store, "grpo", groups_per_step=2, max_staleness=1, prompts=PROMPTS
    )
    want = _rows(source.pipeline().drop_equal_rewards(store).keep_per_prompt(store, 1))
    asyncio.run(store.close())
    assert [(p, [r for _, r in ms]) for p, ms in got] == [(p, [r for _, r in ms]) for p, ms in want]
    ledger = asyncio.run(open_store(yaml_url).stream_ledger("grpo"))
    varied = [r.position for r in ledger.prompts if r.payload["i"] % 3]  # see reward_of
    assert [p for p, _ in got] == varied and all(len(ms) == 1 for _, ms in got)
    dropped = PROMPTS - len(varied)
    assert ledger.counts()["filtered"] == GROUP * dropped + (GROUP - 1) * len(varied)


@pytest.mark.parametrize(
    ("data", "key", "message"),
    [
        (
            {"source": {"kind": "stream"}},
            "source.kind",
            r"'stream' is not one of \('mixture', 'capture_stream'\)",
        ),
        (
            {"source": {"kind": "capture_stream", "store": "memory://x", "stream": "s",
                        "groups_per_step": 1, "max_staleness": 0, "seeed": 1}},
            "source.seeed",
            "unknown parameter of capture_stream",
        ),
        (
            {"source": {"kind": "capture_stream", "store": "memory://x", "stream": "s",
                        "max_staleness": 0}},
            "source.groups_per_step",
            "required",
        ),
        (
            {"datasets": [{"name": "a", "path": "x.jsonl"}],
             "source": {"kind": "capture_stream", "store": "memory://x", "stream": "s",
                        "groups_per_step": 1, "max_staleness": 0}},
            "datasets",
            "a capture_stream source reads a capture store, not datasets: remove it",
        ),
        (
            {"source": {"kind": "capture_stream", "store": 3, "stream": "s",
                        "groups_per_step": 1, "max_staleness": 0}},
            "source.store",
            "give the capture store's URL",
        ),
    ],
)  # fmt: skip
def test_a_bad_capture_stream_section_names_its_key(
    data: dict[str, Any], key: str, message: str
) -> None:
    with pytest.raises(ConfigFileError, match=message) as info:
        parse_config(data)
    assert info.value.key == key
