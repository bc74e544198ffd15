"""`python -m bench.peers.sends`: only the synchronous-send rows of bench.peers, short.

mqmeta's three brokers (acks from the whole SyncStateSet) beside a RabbitMQ quorum queue on
three nodes, the same Python load generator (bench/peers/load.py), in rounds that alternate
which system goes first: one sync producer (p50) and 16 independent sync producers
(msg/s), 1 KB each. With `--profile`, py-spy (200 Hz) on the master, both slaves and this
process while one producer and then 16 send. With `--baseline-python`, a second mqmeta
cluster run by another interpreter (a checkout to compare with) in the same rounds; with
`--compare-majority`, a second cluster whose sends are acknowledged once the master and one
slave hold them (2 of 3, as RabbitMQ's quorum queue confirms), not the whole SyncStateSet; with
`--placed-alike`, one producer again with each cluster's brokers and RabbitMQ's nodes pinned
alike (bench/peers/placement.py), as bench.peers does in every run; with `--cpus-awake`,
one producer again while a SCHED_IDLE spinner on every CPU keeps each vCPU from halting
(placement.awake), every system placed by the kernel. One JSON document on
stdout; `ratios` are mqmeta ÷ RabbitMQ (and ÷ the baseline), medians over the rounds.
About 1.5 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from bench import brokerlib
from bench.benchlib import _ratio, machine, make_log, run_main
from bench.peers import load, placement
from bench.peers.run import NO_CALL_STREAM, STARTED, Mqmeta, _batched, _send_client, cleanup, placed_alike
from bench.peers.servers import RabbitMQ, absent

log = make_log("peers.sends")
MAJORITY = "mqmeta-majority"
MAJORITY_FLAGS = ["--no-all-ack", "--in-sync-replicas", "2"]  # the master and one slave
WATCHDOG_S = 5 * 60  # more per round for --placed-alike and --cpus-awake (main)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.sends", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement (5)")
    parser.add_argument("--no-rabbitmq", action="store_true", help="mqmeta alone")
    parser.add_argument(
        "--compare-grpc",
        action="store_true",
        help="also a second mqmeta cluster whose slaves fetch over gRPC calls (--no-ha-stream), "
        "in the same rounds: `mqmeta-grpc`",
    )
    parser.add_argument(
        "--compare-majority",
        action="store_true",
        help="also a second mqmeta cluster whose master acknowledges a send once it and one "
        f"slave hold it ({' '.join(MAJORITY_FLAGS)}: 2 of 3, as a RabbitMQ quorum queue "
        "confirms), in the same rounds: `mqmeta-majority`",
    )
    parser.add_argument(
        "--compare-call-stream",
        action="store_true",
        help="also drive the first mqmeta cluster with producers that send as gRPC calls, not "
        f"over the call stream, in the same rounds: `{NO_CALL_STREAM}`",
    )
    parser.add_argument(
        "--baseline-python",
        default="",
        metavar="PYTHON",
        help="also a second mqmeta cluster whose processes run PYTHON, e.g. the venv of a checkout "
        "of main (an A/B in the same rounds, beside the same load): `mqmeta-baseline`",
    )
    parser.add_argument(
        "--batched",
        action="store_true",
        help="also 4 producers x 32 messages per call (mqmeta only, as in bench.peers)",
    )
    parser.add_argument(
        "--kills",
        type=int,
        default=0,
        help="then N rounds of kill -9 of the mqmeta master, each timed to the first send "
        "a new master acknowledges (brokerlib.failover_round; 0 = none)",
    )
    parser.add_argument(
        "--placed-alike",
        action="store_true",
        help="also one producer with each cluster's brokers and RabbitMQ's nodes pinned alike "
        "(bench/peers/placement.py): `send_p50_vs_rabbitmq_placed_alike`",
    )
    parser.add_argument(
        "--cpus-awake",
        action="store_true",
        help="also one producer with no vCPU left to halt: one SCHED_IDLE spinner per CPU, "
        "which yields it to any real work (placement.awake): `send_p50_vs_rabbitmq_cpus_awake`",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy on the brokers (needs py-spy)")
    parser.add_argument("--root", default="", help="where the clusters live (default: a temp dir)")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 10 or not 1 <= args.duration <= 60 or not 0 <= args.kills <= 20:
        parser.error("--rounds is 1 to 10, --duration 1 to 60 seconds and --kills 0 to 20")
    if args.baseline_python and not os.access(args.baseline_python, os.X_OK):
        parser.error(f"--baseline-python {args.baseline_python} is no executable file")
    return args


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (/proc/PID/stat), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of all a process's threads so far."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            lines = Path(f"/proc/{pid}/task/{task}/status").read_text().splitlines()
        except OSError:  # the thread ended meanwhile
            continue
        total += sum(int(line.split()[1]) for line in lines if "ctxt_switches:" in line)
    return total


@contextlib.contextmanager
def _interpreter(python: str) -> Iterator[None]:
    """Processes started meanwhile run `python` (cluster/layout.py starts sys.executable)."""
    real = sys.executable
    sys.executable = python
    try:
        yield
    finally:
        sys.executable = real


def _drive_with_cpu(system: Any, send: Any, threads: int, duration_s: float) -> dict[str, Any]:
    """load.drive, and for an mqmeta cluster the CPU each broker and this process used
    meanwhile: cores (CPU seconds per second of the drive, warm-up included), ms of CPU
    per acknowledged message at the measured rate, and each broker's context switches per
    acknowledged message (thread hand-offs: a figure the machine's load moves less)."""
    cluster = getattr(system, "cluster", None)
    pids: dict[str, int] = {}
    if cluster is not None:
        master = brokerlib.wait_in_sync(cluster, 3)
        wanted = ("master", "slave1", "slave2", "bench")
        pids = {k: v for k, v in brokerlib.all_pids(cluster, master).items() if k in wanted}
    brokers = {k: p for k, p in pids.items() if k != "bench"}
    switches = {k: _context_switches(p) for k, p in brokers.items()}
    before, started = {k: _cpu_s(p) for k, p in pids.items()}, time.monotonic()
    figures = load.drive(send, threads, 1.0, duration_s)
    elapsed_s = time.monotonic() - started
    if pids and figures.get("ops_per_s"):
        cores = {k: (_cpu_s(p) - before[k]) / elapsed_s for k, p in pids.items()}
        figures["cpu_cores"] = {k: round(v, 3) for k, v in cores.items()}
        figures["cpu_ms_per_message"] = {
            k: round(v * 1000 / figures["ops_per_s"], 3) for k, v in cores.items()
        }
        messages = figures["ops_per_s"] * elapsed_s  # warm-up included, as the CPU is
        figures["context_switches_per_message"] = {
            k: round((_context_switches(p) - switches[k]) / messages, 2) for k, p in brokers.items()
        }
    return figures


def _round(
    systems: dict[str, Any],
    order: list[str],
    duration_s: float,
    batched: bool,
    placed: bool = False,
    awake: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in order:
        send = _send_client(name, systems[name])
        out[name] = {
            "send_1": _drive_with_cpu(systems[name], send, 1, duration_s),
            "send_16": _drive_with_cpu(systems[name], send, 16, duration_s),
        }
        if placed:
            out[name]["send_1_placed"] = placed_alike(
                name, systems[name], partial(_drive_with_cpu, systems[name], send, 1, duration_s)
            )
        if awake:
            measure = partial(_drive_with_cpu, systems[name], send, 1, duration_s)
            out[name]["send_1_awake"] = awake_phase(measure, duration_s + 60)
        if batched and name != "rabbitmq":  # pika's blocking channel confirms one publish at a time
            batches = partial(_batched, send, load.BATCH)
            out[name]["send_4x32"] = load.drive(batches, 4, 1.0, duration_s, load.BATCH)
        one, sixteen = out[name]["send_1"], out[name]["send_16"]
        log(f"{name}: p50 {one.get('p50_ms')} ms, 16 producers {sixteen['ops_per_s']}/s")
    return out


def awake_phase(measure: Callable[[], dict[str, Any]], max_s: float) -> dict[str, Any]:
    """`measure()` with every vCPU kept awake (placement.awake, each spinner ending on its
    own after `max_s`), or why it was left out ({"skipped": ...}): a spinner that did not
    start, or ended before the phase did."""
    try:
        with placement.awake(max_s):
            return measure()
    except placement.SpinnerError as exc:
        return {"skipped": str(exc)}


def _profile(system: Mqmeta, root: Path, duration_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cluster = system.cluster
    for threads in (1, 16):
        master = brokerlib.wait_in_sync(cluster, 3)
        pids = brokerlib.all_pids(cluster, master)
        targets = {k: v for k, v in pids.items() if k in ("master", "slave1", "slave2", "bench")}
        out_dir = root / f"profile-{threads}"
        out_dir.mkdir(parents=True, exist_ok=True)
        spies = brokerlib.start_py_spy({"dir": out_dir, "rate": 200, "gil": False}, targets, duration_s)
        time.sleep(1.0)  # py-spy attaches
        figures = load.drive(_send_client("mqmeta", system), threads, 0.0, duration_s - 1.5)
        out[f"send_{threads}"] = {"figures": figures, "processes": brokerlib.finish_py_spy(spies)}
    return out


def _kills(system: Mqmeta, kills: int) -> dict[str, Any]:
    """kill -9 of the master -> the first send acknowledged at a higher master epoch, each
    round's killed broker restarted and the set back to 3 in sync before the next."""
    rounds = [brokerlib.failover_round(system.cluster, "SIGKILL", k, 0.3, wait_s=15.0) for k in range(kills)]
    samples = sorted(r["failover_s"] for r in rounds if r.get("failover_s") is not None)
    for r in rounds:
        log(f"kill {r['round']}: {r['old_master']} -> {r.get('new_master')} in {r.get('failover_s')} s")
    return {
        "master_kill_to_next_ack_s": samples,
        "p99_s": samples[-1] if samples else None,  # of at most 20: the largest
        "failed": sum(1 for r in rounds if r.get("failover_s") is None),
        "rounds": rounds,
    }


def _median(rounds: list[dict[str, Any]], system: str, phase: str, key: str) -> float | None:
    values = sorted(r[system][phase][key] for r in rounds if r[system].get(phase, {}).get(key) is not None)
    return values[len(values) // 2] if values else None


def _median_of(rounds: list[dict[str, Any]], system: str, phase: str, key: str, who: str) -> float | None:
    values = sorted(r[system][phase][key][who] for r in rounds if who in r[system][phase].get(key, {}))
    return values[len(values) // 2] if values else None


def summarize(result: dict[str, Any]) -> None:
    rounds = result.get("rounds", [])
    summary: dict[str, Any] = {}
    for system in ("mqmeta", "mqmeta-baseline", "mqmeta-grpc", MAJORITY, NO_CALL_STREAM, "rabbitmq"):
        if rounds and system in rounds[0]:
            summary[system] = {
                "send_p50_ms": _median(rounds, system, "send_1", "p50_ms"),
                "sends_per_s_1": _median(rounds, system, "send_1", "ops_per_s"),
                "sends_per_s_16": _median(rounds, system, "send_16", "ops_per_s"),
            }
            for phase in ("send_1", "send_16"):
                for who in ("master", "slave1", "slave2", "bench"):
                    cpu = _median_of(rounds, system, phase, "cpu_ms_per_message", who)
                    if cpu is not None:
                        summary[system][f"{who}_cpu_ms_per_message_{phase[5:]}"] = cpu
            for phase, figure in (("send_1_placed", "placed_alike"), ("send_1_awake", "cpus_awake")):
                p50 = _median(rounds, system, phase, "p50_ms")
                if p50 is not None:
                    summary[system][f"send_p50_ms_{figure}"] = p50
            if "send_4x32" in rounds[0][system]:
                summary[system]["sends_per_s_4x32"] = _median(rounds, system, "send_4x32", "ops_per_s")
    result["summary"] = summary
    m, r = summary.get("mqmeta", {}), summary.get("rabbitmq", {})
    result["ratios"] = {
        "send_p50_vs_rabbitmq": _ratio(m.get("send_p50_ms"), r.get("send_p50_ms")),
        "sends_per_s_16_vs_rabbitmq": _ratio(m.get("sends_per_s_16"), r.get("sends_per_s_16")),
        "sends_per_s_16_vs_1_mqmeta": _ratio(m.get("sends_per_s_16"), m.get("sends_per_s_1")),
    }
    for figure in ("placed_alike", "cpus_awake"):
        if m.get(f"send_p50_ms_{figure}") is not None:
            result["ratios"][f"send_p50_vs_rabbitmq_{figure}"] = _ratio(
                m.get(f"send_p50_ms_{figure}"), r.get(f"send_p50_ms_{figure}")
            )
    if m.get("sends_per_s_4x32") is not None:  # as bench.peers: batched beside RabbitMQ's 16 producers
        result["ratios"]["sends_per_s_4x32_vs_rabbitmq_16"] = _ratio(
            m.get("sends_per_s_4x32"), r.get("sends_per_s_16")
        )
    _compare_call_stream(result, summary)
    if "mqmeta-baseline" in summary:
        b = summary["mqmeta-baseline"]
        result["ratios"].update(
            {
                f"{key}_vs_baseline": _ratio(m.get(key), b.get(key))
                for key in b
                if key.startswith(("send_p50", "sends_per_s", "master_cpu", "slave1_cpu"))
            }
        )
    if MAJORITY in summary:  # the quorum queue's ack policy: what the default's stronger one costs
        a = summary[MAJORITY]
        result["ratios"].update(
            {
                "majority_send_p50_vs_rabbitmq": _ratio(a.get("send_p50_ms"), r.get("send_p50_ms")),
                "majority_sends_per_s_16_vs_rabbitmq": _ratio(
                    a.get("sends_per_s_16"), r.get("sends_per_s_16")
                ),
                "send_p50_all_vs_majority": _ratio(m.get("send_p50_ms"), a.get("send_p50_ms")),
                "sends_per_s_16_all_vs_majority": _ratio(m.get("sends_per_s_16"), a.get("sends_per_s_16")),
            }
        )
    if "mqmeta-grpc" in summary:
        g = summary["mqmeta-grpc"]
        result["ratios"].update(
            {
                "grpc_send_p50_vs_rabbitmq": _ratio(g.get("send_p50_ms"), r.get("send_p50_ms")),
                "grpc_sends_per_s_16_vs_rabbitmq": _ratio(g.get("sends_per_s_16"), r.get("sends_per_s_16")),
                "send_p50_stream_vs_grpc": _ratio(m.get("send_p50_ms"), g.get("send_p50_ms")),
                "sends_per_s_16_stream_vs_grpc": _ratio(m.get("sends_per_s_16"), g.get("sends_per_s_16")),
            }
        )


def _compare_call_stream(result: dict[str, Any], summary: dict[str, Any]) -> None:
    m, g = summary.get("mqmeta", {}), summary.get(NO_CALL_STREAM, {})
    if g:
        result["ratios"].update(
            {
                "send_p50_call_stream_vs_grpc": _ratio(m.get("send_p50_ms"), g.get("send_p50_ms")),
                "sends_per_s_16_call_stream_vs_grpc": _ratio(
                    m.get("sends_per_s_16"), g.get("sends_per_s_16")
                ),
                "sends_per_s_4x32_call_stream_vs_grpc": _ratio(
                    m.get("sends_per_s_4x32"), g.get("sends_per_s_4x32")
                ),
            }
        )


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    result["machine"] = machine()
    result["parameters"] = {"rounds": args.rounds, "duration_s": args.duration, "body_bytes": load.BODY_BYTES}
    if args.placed_alike:
        result["parameters"]["placement"] = placement.LAYOUT
    if args.cpus_awake:
        result["parameters"]["cpus_awake"] = placement.AWAKE
    mqmeta = Mqmeta(root)
    STARTED.append(mqmeta)
    mqmeta.start()
    systems: dict[str, Any] = {"mqmeta": mqmeta}
    if args.baseline_python:
        baseline = Mqmeta(root, "mqmeta-baseline")
        STARTED.append(baseline)
        with _interpreter(args.baseline_python):
            baseline.start()
        systems["mqmeta-baseline"] = baseline
        result["parameters"]["baseline_python"] = args.baseline_python
    if args.compare_grpc:
        grpc_fetches = Mqmeta(root, "mqmeta-grpc", ["--no-ha-stream"])
        STARTED.append(grpc_fetches)
        grpc_fetches.start()
        systems["mqmeta-grpc"] = grpc_fetches
    if args.compare_majority:
        majority = Mqmeta(root, MAJORITY, MAJORITY_FLAGS)
        STARTED.append(majority)
        majority.start()
        systems[MAJORITY] = majority
    if args.compare_call_stream:
        systems[NO_CALL_STREAM] = mqmeta  # the same cluster, other clients
    why = "not asked for" if args.no_rabbitmq else absent("rabbitmq")
    if why is None:
        rabbit = RabbitMQ(root)
        STARTED.append(rabbit)
        rabbit.start()
        systems["rabbitmq"] = rabbit
    else:
        result["skipped"] = {"rabbitmq": why}
    result["systems"] = {name: getattr(s, "settings", getattr(s, "info", {})) for name, s in systems.items()}
    names = list(systems)
    result["rounds"] = []
    for k in range(args.rounds):
        order = names[k % len(names) :] + names[: k % len(names)]
        result["rounds"].append(
            _round(systems, order, args.duration, args.batched, args.placed_alike, args.cpus_awake)
        )
        summarize(result)
    if args.kills:
        result["kills"] = _kills(mqmeta, args.kills)
    if args.profile:
        result["profile"] = _profile(mqmeta, root, min(8.0, args.duration + 3))
    result["machine"]["load_average_at_end"] = list(os.getloadavg())


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.keep = bool(args.root)
    extra_phases = int(args.placed_alike) + int(args.cpus_awake)
    args.budget_s = WATCHDOG_S + args.rounds * extra_phases * 2 * (args.duration + 10)  # two systems
    root = Path(args.root) if args.keep else Path(tempfile.mkdtemp(prefix="mqmeta-sends-"))
    result: dict[str, Any] = {"benchmark": "bench.peers.sends"}
    return run_main(
        args, root, result, lambda t0: run(args, root, result), summarize, cleanup, log, watchdog_grace_s=60.0
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
