"""The contract a new capture store is written against: its base classes and what they pass.

Why one public module: a store outside zephon subclasses :class:`DurableStore` (or
:class:`SqlStore` for a SQL database) and implements its blocking primitives -
``transact_rollout``, ``freeze_rollout``, ``peek_rollout``, ``fetch_lineage``,
``transact_stream`` and optionally ``remove_rollout`` and ``close_backend`` - over the rollout
state machine (:class:`RolloutState` decides, returning a :class:`Transition`; the store
persists its :class:`Event` s). Everything here is stable to import; the modules it comes
from are not. ``docs/capture-stores.md`` ("Writing a store") walks through one; prove yours
with :mod:`zephon.capture.testing` and register it with
:func:`zephon.capture.stores.register_store`.
"""

from __future__ import annotations

from zephon.capture.stores._durable import (
    Decide,
    DurableStore,
    Offload,
    StreamOp,
    Then,
    decide_stream,
    parse_offload,
    transition_result,
)
from zephon.capture.stores._events import Delete, Event, Put, Retire
from zephon.capture.stores._sql import Cursor, SqlStore
from zephon.capture.stores._state import RolloutState, Transition

__all__ = [
    "Cursor",
    "Decide",
    "Delete",
    "DurableStore",
    "Event",
    "Offload",
    "Put",
    "Retire",
    "RolloutState",
    "SqlStore",
    "StreamOp",
    "Then",
    "Transition",
    "decide_stream",
    "parse_offload",
    "transition_result",
]
