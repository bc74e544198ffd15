#!/usr/bin/env python
"""Full garbage-collection passes of controllers whose state grows under writes, and the
leader changes they cause, with and without freezing what each pass kept.

    .venv/bin/python -m bench.gc_pauses [--seconds 60] [--rounds 1] [--variants freeze,off]
                                        [--thaw-interval-s N]

Three controllers (Raft secret on, default Raft settings, as bench.controller_bench starts
them) per variant and round, on a fresh data directory: `freeze` (the default,
gc_thaw_interval_s 600: controller/gc_pauses.py) and `off` (gc_thaw_interval_s 0: the
collector as Python runs it). 16 client threads of this process create topics one call
after another for `--seconds`, every topic a new key, so each controller's heap grows as
a controller's does when topics are created by the tens of thousands. Each controller
logs its collector's passes (bench.controller_bench's --gc-log launcher knob); this
process asks the first node for the term and leader twice a second. Reported per variant
and round: writes and writes/s, the term changes seen, and per controller the full
passes of 10 ms or more (when, how long), the longest, and the collector's time in all.
The variants alternate which goes first in each round; `--thaw-interval-s` gives the
`freeze` variant a shorter gc_thaw_interval_s, so that the followers' thaws (their one
long pass each) fall within the run. Prints ONE JSON document on
stdout; progress goes to stderr. Every loop is bounded in count and time; every process
listens on 127.0.0.1 and is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.benchlib import _r, environment, make_log, run_main, stop_clusters
from bench.controller_bench import Cluster, topic_request

VARIANTS = {"freeze": [], "off": ["gc_thaw_interval_s=0"]}  # name -> --raft-setting items
CLIENTS = 16
TERM_POLL_S = 0.5
WRITES_MAX = 2_000_000  # per client: the time bound ends a run long before

log = make_log("gc_pauses")


def one_run(root: Path, settings: list[str], seconds: float, clusters: list[Any]) -> dict[str, Any]:
    """One cluster under the writes; times in the result are seconds since the writes began."""
    from mqmeta.client import ControllerClient

    args = argparse.Namespace(
        raft_setting=settings,
        no_secret=False,
        grpc_workers=0,
        switch_interval=0.0,
        profile_leader=False,
        profile_tick=False,
        gc_log=True,
    )
    root.mkdir(parents=True)
    cluster = Cluster(root, args)
    clusters.append(cluster)
    try:
        cluster.start()
        first = cluster.leader_id()
        cluster.wait_healthy(30.0)
        end_at = time.monotonic() + seconds
        counts = [0] * CLIENTS
        failures = [0] * CLIENTS

        def write(k: int) -> None:
            with ControllerClient(cluster.all_grpc(), timeout_s=5.0) as client:
                for i in range(WRITES_MAX):
                    if time.monotonic() >= end_at:
                        return
                    try:
                        client.create_topic(topic_request(f"g{k}", i))
                        counts[k] += 1
                    except Exception:  # a leader change: counted, the next call goes on
                        failures[k] += 1

        threads = [threading.Thread(target=write, args=(k,), daemon=True) for k in range(CLIENTS)]
        started, started_unix = time.monotonic(), time.time()
        for thread in threads:
            thread.start()
        terms: list[tuple[float, int, str]] = []
        while time.monotonic() < end_at:
            try:
                meta = cluster.metadata(first, 1.0)
                terms.append((round(time.monotonic() - started, 1), meta.term, meta.leader_id))
            except Exception:
                pass  # the node busy or electing: the next poll sees the outcome
            time.sleep(TERM_POLL_S)
        for thread in threads:
            thread.join(timeout=30.0)
        elapsed_s = time.monotonic() - started
        time.sleep(1.5)  # each node writes its collector's log every second
        changes = [t for before, t in zip(terms, terms[1:], strict=False) if t[1] != before[1]]
        return {
            "writes": sum(counts),
            "writes_per_s": _r(sum(counts) / elapsed_s, 1),
            "failed_calls": sum(failures),
            "term_changes": [list(t) for t in changes],
            "controllers": {node: _passes(root / f"gc-{node}.json", started_unix) for node in cluster.by_id},
        }
    finally:
        cluster.stop()
        clusters.remove(cluster)


def _passes(path: Path, since_unix: float) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return {"error": f"no collector log: {error}"}
    full = [[_r(ended - since_unix, 2), g, took] for ended, g, took in document["long"] if g == 2]
    return {
        "full_passes_10ms_or_more": full,
        "longest_full_pass_s": max((entry[2] for entry in full), default=0.0),
        "passes": document["counts"],
        "collector_s": _r(sum(document["seconds"]), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="writes per run (60 s)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, each running every variant (1)")
    parser.add_argument("--variants", default="freeze,off", help="which to run (freeze,off)")
    parser.add_argument(
        "--thaw-interval-s", type=int, default=0, help="the freeze variant's gc_thaw_interval_s (its default)"
    )
    parser.add_argument("--budget-s", type=float, default=900.0)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    if not 5 <= args.seconds <= 600 or not 1 <= args.rounds <= 10 or not 0 <= args.thaw_interval_s <= 86_400:
        parser.error("--seconds is 5 to 600, --rounds 1 to 10 and --thaw-interval-s 0 to 86400")
    names = [name for name in args.variants.split(",") if name]
    if not names or any(name not in VARIANTS for name in names):
        parser.error(f"--variants names some of {', '.join(VARIANTS)}")
    variants = {name: list(VARIANTS[name]) for name in names}
    if args.thaw_interval_s and "freeze" in variants:
        variants["freeze"] = [f"gc_thaw_interval_s={args.thaw_interval_s}"]
    root = Path(tempfile.mkdtemp(prefix="gc-pauses-"))
    result: dict[str, Any] = {
        "benchmark": "full GC passes and leader changes under growing state (bench.gc_pauses)",
        "environment": environment(),
        "settings": {"seconds": args.seconds, "clients": CLIENTS, "variants": variants},
        "rows": [],
    }
    clusters: list[Any] = []

    def run(t0: float) -> None:
        for number in range(1, args.rounds + 1):
            for name in names if number % 2 else names[::-1]:
                log(f"round {number}: {name}")
                row = {"variant": name, "round": number}
                row.update(one_run(root / f"r{number}-{name}", variants[name], args.seconds, clusters))
                result["rows"].append(row)
                longest = {n: c.get("longest_full_pass_s") for n, c in row["controllers"].items()}
                log(f"  {row['writes_per_s']}/s, term changes {row['term_changes']}, longest {longest}")

    def summarize(res: dict[str, Any]) -> None:
        summary: dict[str, Any] = {}
        for name in variants:
            rows = [r for r in res["rows"] if r["variant"] == name]
            summary[name] = {
                "writes_per_s": [r["writes_per_s"] for r in rows],
                "term_changes": [len(r["term_changes"]) for r in rows],
                "longest_full_pass_s": [
                    max((c.get("longest_full_pass_s") or 0.0) for c in r["controllers"].values())
                    for r in rows
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
        watchdog_grace_s=120.0,
    )


if __name__ == "__main__":
    sys.exit(main())
