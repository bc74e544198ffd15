#!/usr/bin/env python
"""CPU per metadata write of each controller process, for code versions side by side.

    .venv/bin/python -m bench.controller_cpu --variant base=main --variant after=WORKTREE

Three controllers (Raft secret on, default Raft settings, as bench.controller_bench starts
them) per variant and round; one client on the leader writes `--writes` CreateTopic calls
one after the other, then 16 client threads of this process write for `--concurrent-s`
seconds. The CPU time (utime + stime from /proc/PID/stat) of each controller over each
phase, divided by the writes it saw, is the figure to compare: it moves far less with
the machine's other load than latency or writes/s do (both are reported too). The
variants alternate within each round, so a change of load hits each alike.

A variant is NAME=COMMIT (any git revision) or NAME=WORKTREE (this checkout's files): its
`mqmeta` package is laid out in its installed shape in a temporary directory and the
controllers import it from there (a launcher puts it first on sys.path); the bench
itself and the clients always run this checkout's code. Prints ONE JSON document on
stdout; progress goes to stderr. Every loop is bounded in count and time; every process
listens on 127.0.0.1 and is stopped on exit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.benchlib import _r, cpu_seconds, environment, latency_summary, make_log, run_main, stop_clusters
from bench.controller_bench import Cluster, _commit_index, topic_request

REPOSITORY = Path(__file__).resolve().parents[1]
PARTS = ("controller", "broker_agent", "cluster", "replicator", "chaos", "spark")  # mqmeta.<part>
WORKTREE = "WORKTREE"
CLIENTS = 16
LAUNCHER = (  # runs `mqmeta` with the tree named by its first argument first on sys.path
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from mqmeta.cli import main; sys.exit(main(sys.argv[1:]))"
)

log = make_log("controller_cpu")


def build_tree(revision: str, into: Path) -> str:
    """Lays the package out as installed (mqmeta/, mqmeta/controller/, ...) under `into`;
    returns the commit it came from ('worktree+<HEAD>' for this checkout's files)."""
    into.mkdir(parents=True)
    if revision == WORKTREE:
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPOSITORY / "mqmeta", into / "mqmeta", ignore=skip)
        for part in PARTS:
            shutil.copytree(REPOSITORY / part, into / "mqmeta" / part, ignore=skip)
        head = subprocess.run(
            ["git", "-C", str(REPOSITORY), "rev-parse", "--short", "HEAD"], capture_output=True
        )
        return "worktree+" + head.stdout.decode().strip()
    commit = subprocess.run(
        ["git", "-C", str(REPOSITORY), "rev-parse", "--short", revision], capture_output=True, check=True
    ).stdout.decode()
    archive = subprocess.run(
        ["git", "-C", str(REPOSITORY), "archive", revision, "mqmeta", *PARTS], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    for part in PARTS:
        (into / part).rename(into / "mqmeta" / part)
    return commit.strip()


class VariantCluster(Cluster):
    """bench.controller_bench's cluster, its controllers importing the variant's tree."""

    def __init__(self, root: Path, tree: Path) -> None:
        args = argparse.Namespace(
            raft_setting=[],
            no_secret=False,
            grpc_workers=0,
            switch_interval=0.0,
            profile_leader=False,
            profile_tick=False,
        )
        super().__init__(root, args)
        self.tree = tree

    def command(self, node_id: str) -> list[str]:
        cmd = super().command(node_id)
        assert cmd[1:3] == ["-m", "mqmeta.cli"], cmd
        return [cmd[0], "-c", LAUNCHER, str(self.tree), *cmd[3:]]


def _cpu(pids: dict[str, int]) -> dict[str, float | None]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def _per_write(before: dict[str, float | None], after: dict[str, float | None], leader: str, writes: int):
    out: dict[str, float | None] = {}
    followers = []
    for name, begin in before.items():
        end = after.get(name)
        value = None if begin is None or end is None or not writes else 1000.0 * (end - begin) / writes
        if name == leader:
            out["leader"] = _r(value)
        else:
            followers.append(value)
            out[name] = _r(value)
    known = [v for v in followers if v is not None]
    out["follower_mean"] = _r(sum(known) / len(known)) if known else None
    out["all_controllers"] = _r(sum(v for v in [out.get("leader"), *known] if v is not None))
    return out


def sequential(cluster: VariantCluster, leader: str, writes: int, prefix: str) -> dict[str, Any]:
    from mqmeta.client import ControllerClient

    latencies: list[float] = []
    with ControllerClient([cluster.grpc(leader)], timeout_s=5.0) as client:
        for i in range(50):  # warm-up, not counted
            client.create_topic(topic_request(prefix + "w", i))
        pids = cluster.pids()
        before, t0 = _cpu(pids), time.perf_counter()
        deadline = t0 + 60.0
        for i in range(writes):
            started = time.perf_counter()
            client.create_topic(topic_request(prefix, i))
            latencies.append(time.perf_counter() - started)
            if started > deadline:
                break
        elapsed = time.perf_counter() - t0
        after = _cpu(pids)
    out = {"cpu_ms_per_write": _per_write(before, after, leader, len(latencies))}
    out.update(latency_summary(latencies))
    out["writes_per_s"] = _r(len(latencies) / elapsed, 1)
    return out


def concurrent(cluster: VariantCluster, leader: str, duration_s: float, prefix: str) -> dict[str, Any]:
    from mqmeta.client import ControllerClient

    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    errors: list[str] = []
    start = threading.Barrier(CLIENTS + 1, timeout=30.0)
    window: list[float] = [0.0, 0.0]  # (from, to): perf_counter of the counted window

    def run(k: int) -> None:
        try:
            with ControllerClient([cluster.grpc(leader)], timeout_s=5.0) as client:
                client.create_topic(topic_request(f"{prefix}c{k}w", 0))  # connected before the start
                start.wait()
                i = 0
                while i < 200_000:
                    t0 = time.perf_counter()
                    if t0 >= window[1]:
                        break
                    client.create_topic(topic_request(f"{prefix}c{k}", i))
                    if t0 >= window[0]:
                        latencies[k].append(time.perf_counter() - t0)
                    i += 1
        except Exception as exc:  # reported, never hangs the bench
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(CLIENTS)]
    for thread in threads:
        thread.start()
    now = time.perf_counter()
    window[0], window[1] = now + 0.5, now + 0.5 + duration_s  # half a second of warm-up
    start.wait()
    while time.perf_counter() < window[0]:
        time.sleep(0.005)
    pids = cluster.pids()
    before = _cpu(pids)
    commit_before = _commit_index(cluster.grpc(leader))
    while time.perf_counter() < window[1]:
        time.sleep(0.005)
    after = _cpu(pids)
    commit_after = _commit_index(cluster.grpc(leader))
    for thread in threads:
        thread.join(timeout=15.0)
    counted = [x for per in latencies for x in per]
    out = {"cpu_ms_per_write": _per_write(before, after, leader, len(counted))}
    out.update(latency_summary(counted))
    out["writes_per_s"] = _r(len(counted) / duration_s, 1)
    if commit_before is not None and commit_after is not None and commit_after > commit_before:
        # the writes per Raft entry (group commit) move the CPU per write: compare like with like
        out["writes_per_raft_entry"] = _r(len(counted) / (commit_after - commit_before), 2)
    if errors:
        out["errors"] = errors[:5]
    return out


def one_run(
    root: Path, tree: Path, args: argparse.Namespace, tag: str, clusters: list[Any]
) -> dict[str, Any]:
    root.mkdir(parents=True)
    cluster = VariantCluster(root, tree)
    clusters.append(cluster)
    try:
        cluster.start()
        leader = cluster.leader_id()
        cluster.wait_healthy(20.0)
        out: dict[str, Any] = {"load_average_at_start": list(os.getloadavg()), "leader": leader}
        out["sequential"] = sequential(cluster, leader, args.writes, tag)
        out["concurrent"] = concurrent(cluster, leader, args.concurrent_s, tag)
        out["leader_at_end"] = cluster.leader_id()  # another one: an election during the round
        out["load_average_at_end"] = list(os.getloadavg())
        return out
    finally:
        cluster.stop()
        clusters.remove(cluster)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", required=True, help="NAME=COMMIT or NAME=WORKTREE")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writes", type=int, default=1000)
    parser.add_argument("--concurrent-s", type=float, default=4.0)
    parser.add_argument("--budget-s", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="controller-cpu-"))
    variants = [tuple(v.split("=", 1)) for v in args.variant]
    result: dict[str, Any] = {
        "benchmark": "CPU per metadata write of each controller process (bench.controller_cpu)",
        "environment": environment(),
        "settings": {"writes": args.writes, "concurrent_s": args.concurrent_s, "clients": CLIENTS},
        "variants": {},
        "rows": [],
    }
    clusters: list[Any] = []

    def run(t0: float) -> None:
        trees = {}
        for name, revision in variants:
            trees[name] = root / "trees" / name
            result["variants"][name] = build_tree(revision, trees[name])
        for number in range(1, max(1, min(args.rounds, 20)) + 1):
            order = variants if number % 2 else variants[::-1]
            for name, _ in order:
                log(f"round {number}: {name}")
                row = {"variant": name, "round": number}
                row.update(
                    one_run(root / f"r{number}-{name}", trees[name], args, f"{name}{number}", clusters)
                )
                result["rows"].append(row)
                seq, con = row["sequential"], row["concurrent"]
                log(
                    f"  seq {seq['cpu_ms_per_write']} p50 {seq.get('p50_ms')} | "
                    f"16: {con['writes_per_s']}/s {con['cpu_ms_per_write']}"
                )

    def summarize(res: dict[str, Any]) -> None:
        summary: dict[str, Any] = {}
        for name, _ in variants:
            rows = [r for r in res["rows"] if r["variant"] == name]
            summary[name] = {
                "sequential_leader_cpu_ms": [r["sequential"]["cpu_ms_per_write"]["leader"] for r in rows],
                "sequential_follower_cpu_ms": [
                    r["sequential"]["cpu_ms_per_write"]["follower_mean"] for r in rows
                ],
                "sequential_p50_ms": [r["sequential"].get("p50_ms") for r in rows],
                "concurrent_leader_cpu_ms": [r["concurrent"]["cpu_ms_per_write"]["leader"] for r in rows],
                "concurrent_follower_cpu_ms": [
                    r["concurrent"]["cpu_ms_per_write"]["follower_mean"] for r in rows
                ],
                "concurrent_writes_per_s": [r["concurrent"]["writes_per_s"] for r in rows],
                "concurrent_writes_per_raft_entry": [
                    r["concurrent"].get("writes_per_raft_entry") for r in rows
                ],
            }
        res["summary"] = summary

    return run_main(
        args,
        root,
        result,
        run,
        summarize,
        lambda: stop_clusters(clusters, log),
        log,
        watchdog_grace_s=60.0,
    )


if __name__ == "__main__":
    sys.exit(main())
