"""Object stores: a real S3 server on loopback, ranged reads, retries, errors, node cache."""

from __future__ import annotations
