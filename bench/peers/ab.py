"""`python -m bench.peers.ab`: an A/B of mqmeta's sync sends (or, with `--metadata`, its
metadata writes) between checkouts, in short turns.

Each NAME=PYTHON starts one mqmeta cluster (3 controllers, a namesrv, 3 brokers; with
`--each N`, N of them: see below) whose processes run PYTHON (a checkout's venv); then,
`--turns` times, each cluster in turn (the order rotating) takes `--producers`
closed-loop sync producers of 1 KB messages for `--duration` seconds
(bench/peers/load.py, after a 0.3 s warm-up); with `--metadata`, as many closed-loop
writers of CreateTopic calls to the controllers (the peers bench's metadata write), and
the CPU figure is the controllers' per write. The first NAME is the reference: per turn,
each cluster's figure (one producer: p50 ms; more: msg/s) is divided by the reference's
of the same turn, and the median of those ratios is reported, with each cluster's median
figure and its brokers' CPU per message. Short turns side by side follow a machine whose
speed drifts: bench.peers.sends, which runs longer phases, measured identical code at
0.92 x itself (one producer) and 1.6 x (16).

Turns do not average out what differs between two clusters of the same code (which broker
is master, where their processes and files landed): identical clusters have differed by
up to 5 % in one producer's p50 over 20 turns. `--each N` starts N clusters per NAME (the
copies NAME, NAME-2, ...); `pooled` then divides, per turn, the mean figure of a NAME's
copies by the reference NAME's, and `within` gives each NAME's copies against its first
(identical code: the spread a difference must exceed). One JSON document on stdout;
about 1 + turns x clusters x (duration + 1) seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from bench.benchlib import _r, machine, make_log, run_main
from bench.peers import load
from bench.peers.run import STARTED, Mqmeta, _send_client, cleanup
from bench.peers.sends import _cpu_s, _interpreter

log = make_log("peers.ab")
WATCHDOG_S = 30 * 60


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("clusters", nargs="+", metavar="NAME=PYTHON", help="the first is the reference")
    parser.add_argument("--turns", type=int, default=12, help="turns per cluster (12)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per turn (3)")
    parser.add_argument("--producers", type=int, default=1, help="sync producers (1: p50; more: msg/s)")
    parser.add_argument(
        "--each", type=int, default=1, help="clusters per NAME, pooled per turn (1; at most 4)"
    )
    parser.add_argument(
        "--metadata",
        action="store_true",
        help="metadata writes (CreateTopic) by --producers writers, not sends",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.turns <= 100 or not 1 <= args.duration <= 60 or not 1 <= args.producers <= 64:
        parser.error("--turns is 1 to 100, --duration 1 to 60 seconds and --producers 1 to 64")
    if not 1 <= args.each <= 4:
        parser.error("--each is 1 to 4 clusters per NAME")
    pairs = [c.partition("=") for c in args.clusters]
    if len(pairs) < 2 or any(not name or not sep or not python for name, sep, python in pairs):
        parser.error("give two or more clusters as NAME=PYTHON, e.g. main=.venv/bin/python")
    if len({name for name, _, _ in pairs}) < len(pairs):
        parser.error("each cluster needs a name of its own")
    for _, _, python in pairs:
        if not os.access(python, os.X_OK):
            parser.error(f"{python} is no executable file")
    args.pythons = {name: python for name, _, python in pairs}
    args.copies = {name: copies_of(name, args.each) for name in args.pythons}
    every = [copy for copies in args.copies.values() for copy in copies]
    if len(set(every)) < len(every):
        parser.error(f"the copies' names {every} collide: give NAMEs that do not end in -2 to -4")
    return args


def copies_of(name: str, each: int) -> list[str]:
    """The clusters of NAME: NAME itself, then NAME-2, NAME-3, ..."""
    return [name] + [f"{name}-{k}" for k in range(2, each + 1)]


def pooled(
    figures: dict[str, list[float | None]], copies: dict[str, list[str]], reference: str
) -> dict[str, dict[str, float | None]]:
    """Per NAME: the median over turns of its copies' mean figure divided by the reference
    NAME's (`ratio_to_<reference>`), and of each later copy's figure divided by its first
    copy's (`within`: identical code). A turn in which a copy has no figure counts in
    neither."""
    turns = len(next(iter(figures.values())))

    def mean(name: str, turn: int) -> float | None:
        values = [figures[c][turn] for c in copies[name]]
        present = [v for v in values if v is not None]
        return statistics.fmean(present) if len(present) == len(values) else None

    out: dict[str, dict[str, float | None]] = {}
    for name, names in copies.items():
        ratios = []
        for turn in range(turns):
            mine, theirs = mean(name, turn), mean(reference, turn)
            if mine is not None and theirs:
                ratios.append(mine / theirs)
        within = [
            v / f
            for copy in names[1:]
            for v, f in zip(figures[copy], figures[names[0]], strict=True)
            if v is not None and f
        ]
        out[name] = {
            f"ratio_to_{reference}": _r(statistics.median(ratios)) if ratios else None,
            "within": _r(statistics.median(within)) if within else None,
        }
    return out


def paired(figures: dict[str, list[float | None]], reference: str) -> dict[str, dict[str, Any]]:
    """Each cluster's median figure and the median of its per-turn ratios to `reference`;
    a turn without a figure (no send succeeded, or one failed) counts in neither."""
    summary: dict[str, dict[str, Any]] = {}
    for name, values in figures.items():
        measured = [v for v in values if v is not None]
        ratios = [v / r for v, r in zip(values, figures[reference], strict=True) if v is not None and r]
        summary[name] = {
            "median": _r(statistics.median(measured)) if measured else None,
            f"ratio_to_{reference}": _r(statistics.median(ratios)) if ratios else None,
            "turns_without_figure": len(values) - len(measured),
        }
    return summary


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    result["machine"] = machine()
    result["parameters"] = {
        "turns": args.turns,
        "duration_s": args.duration,
        "producers": args.producers,
        "figure": "p50_ms" if args.producers == 1 else "ops_per_s",
        "clusters": args.pythons,
        "operation": "metadata write (CreateTopic)" if args.metadata else "1 KB sync send",
    }
    result["parameters"]["each"] = args.each
    systems: dict[str, Any] = {}
    for k in range(args.each):  # copy k of every NAME, then copy k + 1: none all first
        for name, python in args.pythons.items():
            copy = args.copies[name][k]
            system = Mqmeta(root, copy)
            STARTED.append(system)
            with _interpreter(python):
                system.start()
            systems[copy] = system
            load.drive(_client(args, system), args.producers, 0.0, 1.0)  # connected (and routed)
    figure = result["parameters"]["figure"]
    figures: dict[str, list[float | None]] = {name: [] for name in systems}
    cpu: dict[str, list[float]] = {name: [] for name in systems}
    names = [copy for copies in args.copies.values() for copy in copies]
    for turn in range(args.turns):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            system = systems[name]
            pids = list((system.controller_pids() if args.metadata else system.broker_pids()).values())
            before = sum(_cpu_s(pid) for pid in pids)
            driven = load.drive(_client(args, system), args.producers, 0.3, args.duration)
            used_s = sum(_cpu_s(pid) for pid in pids) - before
            failed = sum(driven.get("errors", {}).values())
            figures[name].append(None if failed else driven.get(figure))  # a turn with errors: no figure
            cpu[name].append(used_s * 1000 / max(1, driven["count"]))
        log(f"turn {turn + 1}/{args.turns}: " + ", ".join(f"{n} {figures[n][-1]}" for n in names))
    result["figures"] = figures
    result["summary"] = paired(figures, names[0])
    if args.each > 1:
        result["pooled"] = pooled(figures, args.copies, next(iter(args.pythons)))
    cpu_figure = "controller_cpu_ms_per_write" if args.metadata else "broker_cpu_ms_per_message"
    for name in names:
        result["summary"][name][cpu_figure] = _r(statistics.median(cpu[name]))
    result["machine"]["load_average_at_end"] = list(os.getloadavg())


def _client(args: argparse.Namespace, system: Mqmeta) -> Any:
    """The load's client factory: a sync producer, or a metadata writer (each writer its
    own topics, as in the peers bench)."""
    if args.metadata:
        return partial(load.MqmetaWrite, system.addresses)
    return _send_client("mqmeta", system)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.keep = False
    args.budget_s = WATCHDOG_S
    root = Path(tempfile.mkdtemp(prefix="mqmeta-ab-"))
    result: dict[str, Any] = {"benchmark": "bench.peers.ab"}
    return run_main(
        args, root, result, lambda t0: run(args, root, result), _no_summary, cleanup, log, watchdog_grace_s=60
    )


def _no_summary(result: dict[str, Any]) -> None:
    """run() summarizes once every turn is done."""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
