"""The fingerprint of a configuration: what a restore compares to refuse a changed setup.

Checkpoints (the whole pipeline's config) and work sources (their own options) both seal
their configuration with it, so one definition keeps the two from drifting apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import xxhash


def fingerprint(config: Mapping[str, Any]) -> str:
    """xxh64 of a configuration's JSON with sorted keys (what a restore must match)."""
    return xxhash.xxh64(json.dumps(config, sort_keys=True).encode()).hexdigest()
