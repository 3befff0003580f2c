"""Adapters for training frameworks, thin layers over
:class:`zephon.torch_loader.PipelineDataLoader`.

- :mod:`zephon.integrations.transformers`: ``ZephonTrainer``, a Hugging Face ``Trainer`` that
  trains every lane exactly once across ranks and checkpoints the data position with the model.
- :mod:`zephon.integrations.accelerate`: ``prepare_pipeline`` for ``Accelerator`` loops.
- :mod:`zephon.integrations.megatron`: a data provider for Megatron-LM's
  ``--dataloader-type external`` whose rank files resume on any data-parallel size.
- :mod:`zephon.integrations.torchtitan`: ``ZephonDataLoader``, torchtitan's data-loader config
  entry, checkpointed by its DCP checkpointer and resumable on any data-parallel size.
- :mod:`zephon.integrations.trl`: ``CapturedRollouts``, TRL's ``GRPOTrainer`` trained from the
  groups a streaming capture source admits.

Import the submodule you need; each imports its framework.
"""

from __future__ import annotations

__all__: list[str] = []
