"""Broker failover with the DEFAULT liveness settings (what `mqmeta local up` runs).

`python bench/failover_bench.py [--rounds 10] [--load-s 10] [--keep]` starts a real
cluster (3 controllers, a nameserver, one broker set of 3 replicas with the broker's
default flags) and leaves the controller's liveness configuration at its defaults
(heartbeat, dead-after, lease, margin: printed under "liveness"). Then:

- load: 8 producer threads x batches of 128 x 1 KB for --load-s seconds; a false
  failover would show as a new master epoch (reported: master_epoch_changed_under_load)
  and a shrunk SyncStateSet as set epochs;
- R rounds of SIGKILL of the master and R rounds of SIGSTOP, each sample the time from
  the fault to the first send acknowledged with a master epoch above the old one, by a
  probe sending to whoever the nameserver names master (bench/broker_bench.py's
  failover_round; SIGKILLed brokers restarted from their data, SIGSTOPped ones resumed).

Prints one JSON document; targets p99 <= 1.5 s (SIGKILL), <= 3 s (SIGSTOP).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import make_log, run_main, seconds_summary  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import broker_bench  # noqa: E402

log = make_log("failover-bench")
TARGETS_S = {"SIGKILL": 1.5, "SIGSTOP": 3.0}
LIVENESS_KEYS = ("broker_heartbeat_interval_ms", "broker_dead_after_ms", "lease_ms", "lease_margin_ms")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--load-s", type=float, default=10.0)
    parser.add_argument("--attempt-timeout-s", type=float, default=0.3)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--keep", action="store_true")
    return parser.parse_args(argv)


def start_with_defaults(root: Path):
    """The harness configures the tests' fast liveness before brokers start; put the
    defaults back first (brokers read heartbeat interval and lease at registration)."""
    from mqmeta.cluster.harness import Cluster
    from mqmeta.cluster.ready import wait_brokers_ready
    from mqmeta.controller.state_machine import CONFIG_SCHEMA

    from mqmeta.pb import controller_pb2 as pb

    cluster = Cluster(root / "defaults", broker_sets=1, replicas=3, broker_flags=["--tiered-store", ""])
    broker_bench.CLUSTERS.append(cluster)
    cluster.start(brokers=False)
    defaults = {key: str(CONFIG_SCHEMA[key][1]) for key in LIVENESS_KEYS}
    cluster.configure_controller(defaults)
    for broker in cluster.layout.brokers:
        cluster.start_broker(broker.name)
    wait_brokers_ready(cluster.layout.brokers)
    with cluster.client() as client:
        client.create_topic(pb.TopicSpec(name=broker_bench.TOPIC, queue_count=broker_bench.QUEUES))
        config = dict(client.get_config(pb.GetConfigRequest()).values)
    return cluster, {key: config[key] for key in LIVENESS_KEYS}


def load_phase(cluster, seconds: float) -> dict[str, Any]:
    master = broker_bench.wait_in_sync(cluster, 3, timeout_s=30.0)
    epoch_before = cluster.broker_status(master).master_epoch
    run = broker_bench.throughput_run(cluster, 8, 128, 1.0, seconds)
    status = cluster.broker_status(master)
    return {
        "msgs_per_s": run.get("msgs_per_s"),
        "sync_state_set_epochs": run.get("sync_state_set_epochs"),
        "sync_state_set_min_size_seen": run.get("sync_state_set_min_size_seen"),
        "master_epoch_changed_under_load": status.master_epoch != epoch_before or status.role != "MASTER",
    }


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    cluster, liveness = start_with_defaults(root)
    result["liveness"] = liveness
    log(f"cluster up with the default liveness settings {liveness}")
    if args.load_s > 0:
        result["load"] = load_phase(cluster, args.load_s)
        log(f"load: {result['load']}")
    for kind in ("SIGKILL", "SIGSTOP"):
        rounds = []
        for k in range(args.rounds):
            r = broker_bench.failover_round(cluster, kind, k, args.attempt_timeout_s, wait_s=15.0)
            rounds.append(r)
            log(
                f"{kind} {k + 1}/{args.rounds}: {r['old_master']} -> {r.get('new_master')} "
                f"in {r['failover_s']} s"
            )
        result[kind] = {"rounds": rounds}
    broker_bench.stop_cluster(cluster)


def summarize(result: dict[str, Any]) -> None:
    met = {}
    for kind, limit in TARGETS_S.items():
        rounds = result.get(kind, {}).get("rounds", [])
        samples = [r["failover_s"] for r in rounds if r.get("failover_s") is not None]
        result.setdefault(kind, {})["summary"] = seconds_summary(samples)
        p99 = result[kind]["summary"].get("p99_s")
        met[f"{kind.lower()}_p99_le_{limit}s"] = (
            bool(rounds) and p99 is not None and p99 <= limit and len(samples) == len(rounds)
        )
    load = result.get("load")
    if load:
        met["no_false_failover_under_load"] = not load["master_epoch_changed_under_load"]
    result["targets_met"] = met


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mqmeta-failover-bench-"))
    result: dict[str, Any] = {"bench": "mqmeta broker failover, default liveness settings"}
    return run_main(
        args,
        root,
        result,
        lambda t0: run(args, root, result),
        summarize,
        broker_bench.cleanup,
        log,
        watchdog_grace_s=5.0,
        json_default=str,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
