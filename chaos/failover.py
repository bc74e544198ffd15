"""The false-failover checker: a broker set changed master when no fault had touched its master.

A master change is a bump of the broker set's master epoch in the controllers' replicated
log (`applied.jsonl`: every election, and the clearing of a dead master, bumps it; a
re-election of the same broker at a new epoch counts too, since its clients had to move,
and so does the registration of a master whose process restarted before another was
elected, which starts a new epoch: the kill or disk fault that stopped it excuses it).
It is *excused* when, at its time, an injected fault touched the master the set had when
that fault started — killed or suspended it, or cut any of its links (partitions, rings,
bridges) — from the fault's start until GRACE_AFTER_FAULT_MS after its heal. Every other
master change is a false failover: the master was running and reachable, and the
controllers replaced it anyway (e.g. heartbeats late on a loaded machine, or a controller
leader change forgetting the brokers' liveness). Delays and connection losses on the
master's links do not excuse a change: the master stays reachable through them. A change
from no master at all (the controllers cleared a dead master when no replica could take
over, e.g. every broker killed) is a recovery, never a false failover, however late.

The grace window covers what a heal sets off: a killed master restarts, registers and may be
elected again only then (when no other replica was in sync), which takes a few seconds on a
loaded 2-core machine; 10 s is twice the slowest restart seen in the chaos matrix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqmeta.errors import CorruptData
from mqmeta.formats.jsonlines import parse_line, split_lines

GRACE_AFTER_FAULT_MS = 10_000
# faults whose `affected` nodes are stopped outright (the rest touch a node through `cut`)
_STOPPING_KINDS = ("-kill", "-suspend")
DISK_FAULTS = ("power-loss-node", "power-loss-all", "slow-disk", "fsync-eio", "disk-full")  # on mounts
# the disk faults that may take the master's role (a full disk only refuses writes)
_DISK_STOPPING = ("power-loss-node", "power-loss-all", "slow-disk", "fsync-eio")


@dataclass(frozen=True)
class MasterChange:
    at_ms: int
    epoch: int
    master: str  # the process name of the new master, "" when the set was left without one
    previous: str


def master_timeline(
    controller_logs: Iterable[Path], broker_set: str, names_by_address: dict[str, str]
) -> list[MasterChange]:
    """Every master the broker set had, in log order, from every controller's applied.jsonl
    (their union by index: a node killed part-way holds a prefix). The first entry is the
    set's first master (not a change); each later one is a change."""
    records: dict[int, dict[str, Any]] = {}
    for path in controller_logs:
        for raw in split_lines(path.read_bytes())[0]:
            try:
                record = parse_line(raw.decode(), str(path)) if raw else None
            except CorruptData:
                record = None  # the audit reports corrupt lines; this checker reads what it can
            if record is not None:
                records.setdefault(record["index"], record)
    timeline: list[MasterChange] = []
    epoch, master, last_ms = 0, "", 0
    for index in sorted(records):
        record = records[index]
        last_ms = max([last_ms] + [int(c["now_ms"]) for c in record["commands"] if "now_ms" in c])
        for key, value in (record.get("effects") or {}).items():
            if not key.startswith("brokerset/") or key.rsplit("/", 1)[-1] != broker_set or not value:
                continue
            if value["master_epoch"] <= epoch:
                continue
            replica = value["replicas"].get(str(value["master_broker_id"])) or {}
            name = names_by_address.get(replica.get("address", ""), replica.get("address", ""))
            timeline.append(MasterChange(last_ms, value["master_epoch"], name, master))
            epoch, master = value["master_epoch"], name
    return timeline


def master_at(changes: list[MasterChange], first_master: str, at_ms: int) -> str:
    master = first_master
    for change in changes:
        if change.at_ms > at_ms:
            break
        master = change.master
    return master


def touches(fault: dict[str, Any], node: str) -> bool:
    """Whether a fault stopped `node` or cut one of its links."""
    if not node:
        return False
    # the disk faults stop their node (power loss) or its disk (slow-disk, fsync-eio: a master
    # that cannot sync in time is expected to lose its mastership)
    if fault["fault"] in ("all-kill", *_DISK_STOPPING) or fault["fault"].endswith(_STOPPING_KINDS):
        return node in fault.get("affected", [])
    if fault["fault"] == "disk-full":  # a full disk refuses writes; the master stays
        return False
    return any(node in pair for pair in fault.get("cut", []))


def check_false_failovers(
    changes: list[MasterChange],
    first_master: str,
    faults: list[dict[str, Any]],
    grace_ms: int = GRACE_AFTER_FAULT_MS,
) -> dict[str, Any]:
    """faults: the runner's list (fault, start_ms, end_ms, affected, cut). Returns every
    master change, the false ones, and for each fault that touched the master the time
    to the first change after its start (its failover time)."""
    touching = [f for f in faults if touches(f, master_at(changes, first_master, f["start_ms"]))]
    false_ones = []
    for change in changes:
        if not change.previous:
            continue  # the set had no master (cleared when none could be elected): a recovery
        if not any(f["start_ms"] <= change.at_ms <= f["end_ms"] + grace_ms for f in touching):
            false_ones.append(change)
    failover_ms = []
    for fault in touching:
        after = [c.at_ms - fault["start_ms"] for c in changes if c.at_ms >= fault["start_ms"]]
        if after and after[0] <= fault["end_ms"] + grace_ms - fault["start_ms"]:
            failover_ms.append(after[0])
    return {
        "masterChangeCount": len(changes),
        "masterChanges": [vars(c) for c in changes],
        "falseFailoverCount": len(false_ones),
        "falseFailovers": [vars(c) for c in false_ones],
        "faultsTouchingMaster": len(touching),
        "failoverMs": failover_ms,
        "graceMs": grace_ms,
    }


def check_run(
    cluster_dir: Path,
    layout,
    faults: list[dict[str, Any]],
    broker_set: str,
    stopped_ms: int | None = None,
) -> dict[str, Any]:
    """The checker over a finished run's cluster directory (`layout`: cluster.layout). A
    change at or after `stopped_ms` (when the runner began stopping the cluster: a master
    that stops before the controllers is replaced) is the run's end, not a failover."""
    names = {b.grpc: b.name for b in layout.brokers}
    timeline = master_timeline(sorted(cluster_dir.glob("**/applied.jsonl")), broker_set, names)
    first = timeline[0].master if timeline else ""
    if stopped_ms is not None:
        timeline = [change for change in timeline if change.at_ms < stopped_ms]
    return check_false_failovers(timeline[1:], first, faults)
