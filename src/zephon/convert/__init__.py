"""``zephon convert``: tokenize a pipeline's datasets once into Megatron ``.bin/.idx`` shards
with a manifest, a provenance sidecar per shard and, for chat SFT, loss masks; resumable.
``Dataset.from_path(OUT)`` reads the result (see docs/pretokenized.md)."""

from zephon.convert._driver import ConvertResult, ConvertStopped, convert

__all__ = ["ConvertResult", "ConvertStopped", "convert"]
