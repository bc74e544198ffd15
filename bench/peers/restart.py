"""`python -m bench.peers.restart`: restart of a controller node -> serving, beside etcd's
(when installed), and where the restarting controller spends the time. Short: about a
minute for the default 5 restarts of each.

Three controllers only (no brokers or nameserver: their traffic would be load), holding
`--topics` topics. Each restart kills -9 the leader, waits until a new leader commits a
write (as bench.peers' kill phase does), starts the node again and times its first
linearizable read (GetConfig), each attempt on a new connection. An attempt first checks
that the port accepts a TCP connection, as etcd's HTTP attempt finds a refused port at
once: otherwise a gRPC channel opened before the node listens waits out its reconnect
backoff and that is what gets measured. The restarted controller runs under
bench/peers/timed_controller.py; the seconds from the spawn to the end of each start-up
phase (interpreter, imports, arguments, damage_checked, reconciled, raft_node,
snapshot_loaded, grpc_serving, leader_known, caught_up) go in the JSON with the load
average, and so does each controller's idle RSS (2 s after the topics were created).
etcd's side is bench.peers' own (`etcd_kills`).

Bytecode: a node installed from a wheel has its modules compiled (pip compiles them), and
so does one run from a checkout once Python has written its __pycache__; with
PYTHONDONTWRITEBYTECODE=1 (set where this was first run) an editable checkout has none,
and every start compiled mqmeta's modules again (about 0.08 s of CPU). So the benchmark
lets its processes keep compiled modules in a cache of its own (cache_bytecode);
`--no-bytecode` measures without. `--no-raft-secret` runs the controllers with
--insecure-raft, as etcd's peers run here (plain HTTP, no peer authentication): no key
derived at start, no message sealed.

The topics are created in batches (WriteBatch of 512, two clients). With `--snapshot`
(the default from 10,000 topics on) the nodes compact their log every 150 entries, and
single writes after the load make each take a snapshot holding every topic: every
restart measured loads its state from that snapshot and replays only the few entries
written since, as a node that has run for a while does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.benchlib import _r, _ratio, make_log, percentile, seconds_summary
from bench.peers import load, timed_controller
from bench.peers.run import _first_success, etcd_kills
from bench.peers.servers import Etcd, absent

log = make_log("restart")
FIRST_READ_TIMEOUT_S = 30.0
CONNECT_PROBE_TIMEOUT_S = 0.2
IDLE_SETTLE_S = 2.0
PHASES = (
    "interpreter",
    "imports",
    "arguments",
    "damage_checked",
    "reconciled",
    "raft_node",
    "snapshot_loaded",
    "grpc_serving",
    "leader_known",
    "caught_up",
)
LOAD_BATCH = 512  # writes per WriteBatch call: one Raft entry (batch_commands_max)
LOAD_CLIENTS = 2
LOAD_CALL_TIMEOUT_S = 120.0
LOAD_ATTEMPTS_MAX = 10
RETRIED = {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
SNAPSHOT_TOPICS_MIN = 10_000  # --snapshot's default from this many topics on
SNAPSHOT_WAIT_S = 300.0
COMPACTION_ENTRIES = 150  # --snapshot: the nodes compact their log past this many entries
PAD_WRITES_MAX = 4 * COMPACTION_ENTRIES
SNAPSHOT_POLL_WRITES = 10
WARM_TIMEOUT_S = 120.0
# What a controller imports, with a Raft secret too (its ciphers: controller/raft_ciphers.py)
WARM_IMPORTS = (
    "import mqmeta.controller.server, mqmeta.cli, bench.peers.timed_controller, "
    "mqmeta.controller.raft_ciphers"
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.restart", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--restarts", type=int, default=5, help="restarts of each system (default 5)")
    parser.add_argument("--topics", type=int, default=100, help="topics in the controllers' state (100)")
    parser.add_argument("--no-etcd", action="store_true", help="mqmeta alone")
    parser.add_argument(
        "--bytecode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep compiled modules (in a cache of the run's own), as an installed node has them (default)",
    )
    parser.add_argument(
        "--raft-secret",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the controllers with a Raft secret (default), or with --insecure-raft as etcd's peers",
    )
    parser.add_argument(
        "--snapshot",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"restart from a snapshot holding every topic (default: from {SNAPSHOT_TOPICS_MIN:,} topics on)",
    )
    args = parser.parse_args(argv)
    if args.topics < 0 or args.restarts < 1:
        parser.error("--topics must be 0 or more and --restarts at least 1")
    if args.snapshot is None:
        args.snapshot = args.topics >= SNAPSHOT_TOPICS_MIN
    return args


def accepts(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def read_once(address: str) -> bool:
    """One linearizable read on one node over a new channel, once its port accepts."""
    from mqmeta.client import ControllerClient
    from mqmeta.pb import controller_pb2 as pb

    if not accepts(address):
        return False
    with ControllerClient([address], timeout_s=0.5) as client:
        return bool(client.get_config(pb.GetConfigRequest(), timeout_s=0.5))


def phases_of(log_path: Path, offset: int, spawned_at: float) -> dict[str, dict[str, float | None]]:
    """Seconds from the spawn to the end of each phase (`phases_s`) and the process's CPU
    seconds by then (`phases_cpu_s`), from the node's log after `offset`."""
    found: dict[str, tuple[float, float | None]] = {}
    with open(log_path, "rb") as lines:
        lines.seek(offset)
        for raw in lines:
            words = raw.decode(errors="replace").split()
            if len(words) in (3, 4) and words[0] == timed_controller.PHASE_PREFIX:
                cpu = float(words[3]) if len(words) == 4 else None
                found.setdefault(words[1], (float(words[2]) - spawned_at, cpu))
    return {
        "phases_s": {phase: _r(found[phase][0]) if phase in found else None for phase in PHASES},
        "phases_cpu_s": {phase: _r(found[phase][1]) if phase in found else None for phase in PHASES},
    }


def restart_once(cluster: Any, k: int) -> dict[str, Any]:
    from mqmeta.cluster.layout import controller_command

    from mqmeta.pb import controller_pb2 as pb

    leader = cluster.leader_id()
    node = cluster.node(leader)
    cluster.kill(leader)
    with cluster.client([n.id for n in cluster.layout.controllers if n.id != leader], timeout_s=30) as client:
        client.create_topic(pb.TopicSpec(name=f"after-kill-{k}", queue_count=1))  # a new leader commits
    command = controller_command(cluster.root, cluster.layout, node, cluster.raft_secret) + [
        "--config",
        str(cluster._config_file),
    ]
    assert command[1:3] == ["-m", "mqmeta.cli"], command
    command[1:3] = [str(Path(timed_controller.__file__).resolve())]
    log_path = cluster.root / "logs" / f"{leader}.log"
    offset = log_path.stat().st_size
    spawned_at = time.time()
    t0 = time.monotonic()
    cluster.supervisor.start(leader, command, cluster.process_env(leader))
    served = _first_success(lambda: read_once(node.grpc), FIRST_READ_TIMEOUT_S)
    restart_s = None if served is None else time.monotonic() - t0
    time.sleep(0.2)  # the last phase lines reach the log
    return {"restart_to_serving_s": _r(restart_s)} | phases_of(log_path, offset, spawned_at)


def create_topics(cluster: Any, topics: int) -> float:
    """Creates topic-0 .. topic-(topics-1) in WriteBatch calls from LOAD_CLIENTS clients;
    returns the seconds it took. A write refused as UNAVAILABLE or DEADLINE_EXCEEDED (a
    leader change, a slow commit on a loaded machine) is sent again; ALREADY_EXISTS then
    means its first attempt committed."""
    starts = iter(range(0, topics, LOAD_BATCH))
    lock = threading.Lock()
    errors: list[str] = []

    def client_loop() -> None:
        with cluster.client(timeout_s=LOAD_CALL_TIMEOUT_S) as client:
            while not errors:
                with lock:
                    first = next(starts, None)
                if first is None:
                    return
                problem = create_batch(
                    client, [f"topic-{i}" for i in range(first, min(first + LOAD_BATCH, topics))]
                )
                if problem:
                    errors.append(problem)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(LOAD_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(errors[0])
    return time.monotonic() - t0


def create_batch(client: Any, names: list[str]) -> str:
    """Creates `names` in one WriteBatch, sending again what was refused for a while; '' or
    what went wrong."""
    from mqmeta.pb import controller_pb2 as pb

    done = {"", "ALREADY_EXISTS", "TOPIC_EXISTS"}  # exists: an earlier attempt committed it
    for _ in range(LOAD_ATTEMPTS_MAX):
        writes = [pb.WriteOp(create_topic=pb.TopicSpec(name=name, queue_count=4)) for name in names]
        try:
            results = client.write(pb.WriteBatch(writes=writes), timeout_s=LOAD_CALL_TIMEOUT_S).results
        except Exception as error:  # the whole call failed: send it all again
            log(f"a batch of {len(names)} creates failed ({error}); again")
            continue
        failed = [(name, r) for name, r in zip(names, results, strict=True) if r.error_code not in done]
        if not failed:
            return ""
        if any(r.error_code not in RETRIED for _, r in failed):
            return f"creating {failed[0][0]} failed: {failed[0][1].error_code} {failed[0][1].message}"
        names = [name for name, _ in failed]
    return f"{len(names)} creates still failed after {LOAD_ATTEMPTS_MAX} attempts"


def snapshot_index(path: Path) -> int:
    """The Raft index a node's snapshot file was taken at (0: none, or being replaced)."""
    from mqmeta.controller import snapshot

    try:
        return int(snapshot.read_position(path)[0][1])
    except Exception:  # absent, or renamed over while read: look again
        return 0


def force_snapshots(cluster: Any) -> dict[str, Any]:
    """Makes every node hold a snapshot of every topic: the nodes compact after
    COMPACTION_ENTRIES entries, so single writes (`pad-N` topics) after the load make each
    take one past the load's last index. A snapshot every second instead (even only after
    the load) cost a loaded machine minutes: the first restart replays the whole load."""
    from mqmeta.pb import controller_pb2 as pb

    t0 = time.monotonic()
    paths = {n.id: cluster.root / n.data_dir / "raft.snapshot" for n in cluster.layout.controllers}
    indexes: dict[str, int] = {}
    with cluster.client(timeout_s=LOAD_CALL_TIMEOUT_S) as client:
        target = client.get_metadata(pb.GetMetadataRequest()).commit_index
        for pad in range(PAD_WRITES_MAX):
            if pad % SNAPSHOT_POLL_WRITES == 0:
                indexes = {node: snapshot_index(path) for node, path in paths.items()}
                if min(indexes.values()) >= target:
                    break
            if time.monotonic() - t0 > SNAPSHOT_WAIT_S:
                break
            client.create_topic(pb.TopicSpec(name=f"pad-{pad}", queue_count=1))
    if min(indexes.values(), default=0) < target:
        raise RuntimeError(f"no snapshot at index {target} on every node: {indexes}")
    return {
        "index": target,
        "snapshot_indexes": indexes,
        "pad_writes": pad,
        "waited_s": _r(time.monotonic() - t0),
        "bytes": {node: path.stat().st_size for node, path in paths.items()},
    }


def cache_bytecode(root: Path) -> None:
    """Lets every process this one starts write and read its compiled modules in
    `root`/pycache (PYTHONPYCACHEPREFIX; never in the checkout): the cluster's first start
    finds what a controller imports compiled (WARM_IMPORTS, compiled first). A prefix
    alone is not enough: Python then looks for every module's bytecode there, the standard
    library's too, and with PYTHONDONTWRITEBYTECODE=1 would compile all of it at each start."""
    os.environ["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    # Compiled before the cluster starts: a node that compiles its modules keeps the
    # compiler's garbage in its heap (4 MB more idle RSS than one that found them compiled).
    subprocess.run([sys.executable, "-c", WARM_IMPORTS], check=True, timeout=WARM_TIMEOUT_S)


def mqmeta_restarts(
    root: Path, restarts: int, topics: int, snapshot: bool, raft_secret: bool
) -> dict[str, Any]:
    from mqmeta.cluster.harness import Cluster

    settings = {"compaction_min_entries": COMPACTION_ENTRIES} if snapshot else None
    cluster = Cluster(root / "mqmeta", count=3, raft_settings=settings, raft_secret=raft_secret)
    out: dict[str, Any] = {}
    try:
        cluster.start()
        out["create_topics_s"] = _r(create_topics(cluster, topics))
        log(f"{topics} topics created in {out['create_topics_s']} s")
        if snapshot:
            out["snapshot"] = force_snapshots(cluster)
            log(f"every node holds a snapshot past index {out['snapshot']['index']}")
        time.sleep(IDLE_SETTLE_S)
        idle_rss_mb = {
            n.id: load.rss_mb(cluster.supervisor.children[n.id].pid) for n in cluster.layout.controllers
        }
        samples = []
        for k in range(restarts):
            samples.append(restart_once(cluster, k))
            log(f"mqmeta restart {k + 1}/{restarts}: {samples[-1]['restart_to_serving_s']} s")
            cluster.wait_ready()
    finally:
        cluster.stop()
    times = [s["restart_to_serving_s"] for s in samples]
    phases = {
        kind: {
            phase: _r(percentile([s[kind][phase] for s in samples if s[kind][phase] is not None], 50))
            for phase in PHASES
        }
        for kind in ("phases_s", "phases_cpu_s")
    }
    summary = seconds_summary([t for t in times if t is not None])
    return out | {
        "restart_to_serving_s": summary,
        "failed": times.count(None),
        "phases_p50_s": phases["phases_s"],
        "phases_cpu_p50_s": phases["phases_cpu_s"],
        "idle_rss_mb": idle_rss_mb,
        "runs": samples,
    }


def etcd_restarts(root: Path, restarts: int) -> dict[str, Any]:
    etcd = Etcd(root)
    try:
        etcd.start()
        time.sleep(IDLE_SETTLE_S)
        idle_rss_mb = {node: load.rss_mb(pid) for node, pid in etcd.pids().items()}
        return dict(etcd_kills(etcd, restarts), idle_rss_mb=idle_rss_mb)
    finally:
        etcd.stop()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mqmeta-restart-"))
    result: dict[str, Any] = {
        "benchmark": "bench.peers.restart",
        "parameters": {
            "restarts": args.restarts,
            "topics": args.topics,
            "snapshot": args.snapshot,
            "bytecode": args.bytecode,
            "raft_secret": args.raft_secret,
            "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
        },
        "load_average_at_start": list(os.getloadavg()),
    }
    try:
        if args.bytecode:
            cache_bytecode(root)
        result["mqmeta"] = mqmeta_restarts(root, args.restarts, args.topics, args.snapshot, args.raft_secret)
        if not args.no_etcd:
            missing = absent("etcd")
            if missing:
                result["skipped"] = {"etcd": missing}
            else:
                result["etcd"] = etcd_restarts(root, args.restarts)
                result["restart_to_serving_p50_vs_etcd"] = _ratio(
                    result["mqmeta"]["restart_to_serving_s"]["p50_s"],
                    result["etcd"]["restart_to_serving_s"].get("p50_s"),
                )
                result["idle_rss_vs_etcd"] = _ratio(
                    percentile(list(result["mqmeta"]["idle_rss_mb"].values()), 50),
                    percentile(list(result["etcd"]["idle_rss_mb"].values()), 50),
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)  # a 100,000-topic run leaves 400 MB otherwise
    result["load_average_at_end"] = list(os.getloadavg())
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
