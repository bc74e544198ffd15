"""`python bench/peers/timed_controller.py ARGS`: `mqmeta ARGS` (a controller node) that
prints, on stderr, when each phase of its start ends (bench/peers/restart.py reads them).

One line per phase, `STARTUP_PHASE <phase> <unix time> <CPU seconds of the process so far>`
(the CPU time tells what a phase costs apart from a loaded machine's waits): `interpreter` (this file runs:
the interpreter and site are up), `imports` (the controller's modules: gRPC, protobuf,
pysyncobj, prometheus), `arguments` (the command line parsed, the configuration and TLS
set up), `damage_checked` (the journal's and the snapshot's checksums checked:
controller/repair.py), `reconciled` (the journal compared with the snapshot's position),
`raft_node` (the Raft node built and listening), `snapshot_loaded` (the snapshot's state
installed, the first time only), `grpc_serving` (the gRPC server started), `leader_known`
(Raft heard from a leader) and `caught_up` (then applied what it knows to be committed). Only for the
benchmark: it wraps the functions that end each phase, nothing else changes.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

PHASE_PREFIX = "STARTUP_PHASE"
WATCH_S = 30.0  # how long the Raft phases are watched for
WATCH_STEP_S = 0.002


def mark(phase: str) -> None:
    sys.stderr.write(f"{PHASE_PREFIX} {phase} {time.time():.6f} {time.process_time():.6f}\n")
    sys.stderr.flush()


def _watch_raft(raft: Any) -> None:
    deadline = time.monotonic() + WATCH_S
    while raft._getLeader() is None and time.monotonic() < deadline:
        time.sleep(WATCH_STEP_S)
    mark("leader_known")
    while raft.raftLastApplied < raft.raftCommitIndex and time.monotonic() < deadline:
        time.sleep(WATCH_STEP_S)
    mark("caught_up")


def _marking(function: Any, phase: str) -> Any:
    def marked(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        mark(phase)
        return result

    return marked


def _instrument() -> None:
    from mqmeta.controller import operations, raft_node, snapshot

    import mqmeta.cli
    from mqmeta.rpc import AsyncServer

    build = operations.ControllerOperations.__init__
    start = AsyncServer.start
    dispatch = mqmeta.cli._dispatch

    def dispatched(args: Any) -> int:
        mark("arguments")
        return dispatch(args)

    def built(self: Any, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        mark("raft_node")
        threading.Thread(target=_watch_raft, args=(self.raft,), daemon=True).start()

    def started(self: Any) -> None:
        start(self)
        mark("grpc_serving")

    mqmeta.cli._dispatch = dispatched
    if hasattr(raft_node, "inspect_data_dir"):
        raft_node.inspect_data_dir = _marking(raft_node.inspect_data_dir, "damage_checked")
    else:  # the code before the snapshot was read once (for a before/after run)
        raft_node.damage_of = _marking(raft_node.damage_of, "damage_checked")  # type: ignore[attr-defined]
    raft_node.reconcile_with_snapshot = _marking(raft_node.reconcile_with_snapshot, "reconciled")
    snapshot.StateSnapshots.deserialize = _marking(  # type: ignore[method-assign]
        snapshot.StateSnapshots.deserialize, "snapshot_loaded"
    )
    operations.ControllerOperations.__init__ = built  # type: ignore[method-assign]
    AsyncServer.start = started  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    mark("interpreter")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
    import mqmeta.controller.server  # noqa: F401 - what `mqmeta controller` imports

    import mqmeta.cli

    mark("imports")
    _instrument()
    return mqmeta.cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
