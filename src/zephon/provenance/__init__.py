"""Provenance: which documents made each training step, and where two runs first diverged.

* :meth:`SampleBatch.provenance` (:func:`batch_provenance`): per row, its segments with
  dataset, file, line or row, sample id, lineage and token spans in the row and the source,
  and for rows packed with images where each image is stored (:class:`ImageSource`).
* :meth:`SampleBatch.fingerprint` (:func:`content_fingerprint`): a stable digest of a batch's
  content.
* :class:`ProvenanceLog`: every delivered batch's segments as Parquet (``zephon run
  --provenance``); :func:`find` answers "which steps trained on FILE:LINE".
* :func:`trace`: rebuild the batch of step N from the newest checkpoint before it.
* :func:`diff`: the first step at which two runs (logs or ``--record`` files) differ.
"""

from zephon.provenance._diff import Divergence, diff
from zephon.provenance._extract import batch_provenance, content_fingerprint, raw_segments
from zephon.provenance._find import FIND_FORMS, Hit, find, parse_query, run_dataset_names
from zephon.provenance._log import ProvenanceLog, read_log
from zephon.provenance._model import BatchProvenance, ImageSource, Segment
from zephon.provenance._origin import Origin
from zephon.provenance._trace import TraceResult, restore_before
from zephon.provenance._trace import trace as trace

__all__ = [
    "FIND_FORMS",
    "BatchProvenance",
    "Divergence",
    "Hit",
    "ImageSource",
    "Origin",
    "ProvenanceLog",
    "Segment",
    "TraceResult",
    "batch_provenance",
    "content_fingerprint",
    "diff",
    "find",
    "parse_query",
    "raw_segments",
    "read_log",
    "restore_before",
    "run_dataset_names",
]
