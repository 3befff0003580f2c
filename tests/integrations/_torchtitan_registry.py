"""A torchtitan config registry (``--module tests.integrations._torchtitan_registry``) whose config
has the data-loader entry of torchtitan's ``Trainer.Config``: a field typed
``BaseDataLoader.Config`` that holds zephon's. ``Trainer.Config`` itself cannot be imported on
this CPU-only machine (torchtitan's models import triton)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.config import TrainingConfig

from tests.integrations._corpus import BATCH, ROW_LENGTH
from zephon.integrations.torchtitan import ZephonDataLoader


@dataclass(kw_only=True, slots=True)
class JobConfig:
    hf_assets_path: str = "."  # torchtitan's ConfigManager checks that it exists
    training: TrainingConfig = field(default_factory=TrainingConfig)
    dataloader: BaseDataLoader.Config = field(default_factory=BaseDataLoader.Config)


def zephon_debugmodel() -> JobConfig:
    return JobConfig(
        training=TrainingConfig(local_batch_size=BATCH, seq_len=ROW_LENGTH, steps=4),
        dataloader=ZephonDataLoader.Config(pipeline="tests.integrations._corpus:build_pipeline"),
    )
