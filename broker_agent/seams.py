"""What replication and the tiered uploader may use of the broker (not the agent itself).

The agent (agent.py) is the shell around the pure core (core.py); the slave's fetch
loop and the master's fetch answers (ha_fetch.py) and the tiered uploader and
bootstrap (tiered.py) run inside that shell but see only `BrokerHost`: who this broker
set is, the store, the lock that orders role changes with store writes, a snapshot of
the role, and `feed` to hand the core an event (the host carries out the effects).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from mqmeta.broker_agent.core import Effect, Event, LogView, RoleView
from mqmeta.broker_agent.store import MessageStore


class BrokerHost(Protocol):
    @property
    def cluster(self) -> str: ...

    @property
    def broker_name(self) -> str: ...

    @property
    def store(self) -> MessageStore: ...

    @property
    def lock(self) -> threading.Condition:
        """Held while the core changes and while role-dependent store writes happen;
        waiting fetches and writers wait on it."""
        ...

    @property
    def stopping(self) -> threading.Event: ...

    def view(self) -> RoleView:
        """The core's role, epoch, confirm offset and fetch session, right now."""
        ...

    def feed(self, event: Event) -> list[Effect]:
        """Hands `event` to the core and carries out its effects in order (raising a
        refusal last); returns the effects, e.g. the answer to a slave's fetch."""
        ...

    def sync_replicated(self) -> int:
        """With the lock held: makes the bytes this slave has appended durable (its next
        fetch acknowledges them) and returns how far its log is durable; a failed fdatasync
        ends the broker as a failed append's does."""
        ...

    def wait_for_append(self, timeout_s: float) -> None:
        """With the lock held: waits (releasing it) until the log grows, the role or the
        epoch changes, or `timeout_s` passes."""
        ...

    def park(self, parked: Any) -> None:
        """With the lock held: holds a streamed fetch (ha_fetch.ParkedFetch) until an
        append answers it through its connection."""
        ...

    def unpark(self, parked: Any) -> bool:
        """With the lock held: takes it back; whether it was still parked."""
        ...

    def serves(self, master_epoch: int) -> bool:
        """With the lock held: would a fetch of a slave following `master_epoch` be answered?"""
        ...

    def request_refresh(self) -> None:
        """Ask the controller for this broker set's replica info soon."""
        ...

    def call_controller(self, method: str, request: Any) -> Any:
        """One controller call (a deadline and retries to the leader are the client's)."""
        ...


def log_view(store: MessageStore) -> LogView:
    """The store's shape as the core sees it."""
    return LogView(store.max_offset, tuple(store.epochs.entries), store.min_offset, store.durable_offset)
