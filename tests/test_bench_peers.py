"""bench/peers starts each peer that is installed as a 3-node cluster on loopback and
stops every process it started (by pid): after stop() none of its pids is alive. A peer
that is not installed is skipped here as the bench skips it (with the package to install).
RabbitMQ's start takes ~40 s on this machine kind: slow runs only. Not the benchmark.
The restart bench's phase lines (bench/peers/timed_controller.py) are read back as seconds
from the spawn and the process's CPU seconds then (None from a line without them), the
first of each phase, and a missing phase is None."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.peers import load, placement, restart, run, timed_controller
from bench.peers.load import _strace_calls
from bench.peers.servers import PEERS, _alive, absent

pytestmark = [pytest.mark.timeout(180)]

PARAMS = [
    pytest.param("etcd"),
    pytest.param("nats"),
    pytest.param("rabbitmq", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", PARAMS)
def test_peer_starts_three_nodes_and_stops_them(name: str, tmp_path: Path) -> None:
    why = absent(name)
    if why is not None:
        pytest.skip(why)
    peer = PEERS[name](tmp_path)
    try:
        peer.start()
        pids = peer.pids()
        assert len(pids) == 3, pids
        assert all(_alive(pid) for pid in pids.values())
    finally:
        peer.stop()
    assert not any(_alive(pid) for pid in pids.values()), pids
    assert peer.pids() == {}


def test_strace_summary_is_read_per_call() -> None:
    summary = (
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 90.00    0.000900           3       300           fdatasync\n"
        " 10.00    0.000100           6        16         2 fsync\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.001000           3       316         2 total\n"
    )
    assert _strace_calls(summary) == {"fdatasync": 300, "fsync": 16}


def test_restart_phases_are_read_from_the_log(tmp_path: Path) -> None:
    log = tmp_path / "c1.log"
    log.write_bytes(b"an earlier run\n")
    offset = log.stat().st_size
    prefix = timed_controller.PHASE_PREFIX
    lines = [
        f"{prefix} interpreter 100.05",
        "WARNING something",
        f"{prefix} imports 100.5 0.4",
        f"{prefix} imports 101 0.6",
    ]
    log.write_text(log.read_text() + "\n".join(lines) + "\n")
    read = restart.phases_of(log, offset, spawned_at=100.0)
    phases, cpu = read["phases_s"], read["phases_cpu_s"]
    assert phases["interpreter"] == 0.05 and phases["imports"] == 0.5
    assert cpu["interpreter"] is None and cpu["imports"] == 0.4
    assert phases["caught_up"] is None and set(phases) == set(cpu) == set(restart.PHASES)


def test_sends_ratios_are_medians_over_rounds_and_bad_flags_are_refused() -> None:
    """bench.peers.sends: `ratios` divide mqmeta's median over the rounds by RabbitMQ's,
    and an out-of-range flag ends argparse with exit 2."""
    from bench.peers import sends

    def round_of(p50_m: float, rate_m: float, p50_r: float, rate_r: float) -> dict:
        return {
            "mqmeta": {"send_1": {"p50_ms": p50_m, "ops_per_s": 100.0}, "send_16": {"ops_per_s": rate_m}},
            "rabbitmq": {"send_1": {"p50_ms": p50_r, "ops_per_s": 400.0}, "send_16": {"ops_per_s": rate_r}},
        }

    result = {
        "rounds": [round_of(3.0, 300, 1.0, 900), round_of(9.0, 100, 1.5, 1000), round_of(4.0, 200, 2.0, 800)]
    }
    sends.summarize(result)
    assert result["summary"]["mqmeta"]["send_p50_ms"] == 4.0
    assert result["ratios"]["send_p50_vs_rabbitmq"] == 2.667
    assert result["ratios"]["sends_per_s_16_vs_rabbitmq"] == 0.222
    assert "send_p50_vs_rabbitmq_placed_alike" not in result["ratios"]  # not asked for
    for k, (placed_m, placed_r) in enumerate([(1.0, 1.1), (0.9, 1.0), (2.0, 1.2)]):
        result["rounds"][k]["mqmeta"]["send_1_placed"] = {"p50_ms": placed_m}
        result["rounds"][k]["rabbitmq"]["send_1_placed"] = {"p50_ms": placed_r}
    del result["rounds"][2]["rabbitmq"]["send_1_placed"]  # skipped there: left out of its median
    sends.summarize(result)
    assert result["summary"]["mqmeta"]["send_p50_ms_placed_alike"] == 1.0
    assert result["ratios"]["send_p50_vs_rabbitmq_placed_alike"] == 0.909  # 1.0 / 1.1
    assert result["ratios"]["send_p50_vs_rabbitmq"] == 2.667
    assert "send_p50_vs_rabbitmq_cpus_awake" not in result["ratios"]  # not asked for
    for k, (awake_m, awake_r) in enumerate([(0.8, 1.0), (0.7, 0.9), (0.6, 1.1)]):
        result["rounds"][k]["mqmeta"]["send_1_awake"] = {"p50_ms": awake_m}
        result["rounds"][k]["rabbitmq"]["send_1_awake"] = {"p50_ms": awake_r}
    sends.summarize(result)
    assert result["summary"]["rabbitmq"]["send_p50_ms_cpus_awake"] == 1.0
    assert result["ratios"]["send_p50_vs_rabbitmq_cpus_awake"] == 0.7  # 0.7 / 1.0
    assert result["ratios"]["send_p50_vs_rabbitmq_placed_alike"] == 0.909
    assert sends.parse_args(["--placed-alike"]).placed_alike
    assert sends.parse_args(["--cpus-awake"]).cpus_awake
    with pytest.raises(SystemExit) as exit_info:
        sends.parse_args(["--rounds", "0"])
    assert exit_info.value.code == 2


def test_cpu_medians_are_per_process_over_rounds_and_bad_flags_are_refused() -> None:
    """bench.peers.cpu: each process's CPU per write is its median over the rounds (a
    process missing from a round is left out of that round), `cpu_ms_per_write_all` their
    sum; an out-of-range flag ends argparse with exit 2."""
    from bench.peers import cpu

    def phase(p50: float, rate: float, **per_write: float) -> dict:
        return {"figures": {"p50_ms": p50, "ops_per_s": rate}, "cpu_ms_per_write": per_write}

    result = {
        "rounds": [
            {"write_1": phase(3.0, 300, leader=2.0, namesrv=0.5), "write_16": phase(9.0, 900, leader=0.8)},
            {"write_1": phase(5.0, 200, leader=3.0, namesrv=0.7), "write_16": phase(7.0, 700, leader=0.6)},
            {"write_1": phase(4.0, 250, leader=9.0), "write_16": phase(8.0, 800, leader=0.7)},
        ]
    }
    cpu.summarize(result)
    one = result["medians"]["write_1"]
    assert (one["p50_ms"], one["writes_per_s"]) == (4.0, 250)
    assert one["cpu_ms_per_write"] == {"leader": 3.0, "namesrv": 0.6}
    assert one["cpu_ms_per_write_all"] == 3.6
    assert result["medians"]["write_16"]["cpu_ms_per_write"] == {"leader": 0.7}
    for flags in (["--rounds", "0"], ["--duration", "0.1"]):
        with pytest.raises(SystemExit) as exit_info:
            cpu.parse_args(flags)
        assert exit_info.value.code == 2


def test_sends_baseline_ratios_are_medians_of_cpu_per_message_and_a_missing_python_is_refused() -> None:
    """bench.peers.sends --baseline-python: the `_vs_baseline` ratios divide mqmeta's median
    over the rounds (CPU per message too) by the baseline cluster's; a baseline interpreter
    that is no executable file ends argparse with exit 2."""
    from bench.peers import sends

    def phases(p50: float, master_cpu: float) -> dict:
        cpu = {"master": master_cpu, "slave1": 0.2}
        return {
            "send_1": {"p50_ms": p50, "ops_per_s": 100.0, "cpu_ms_per_message": cpu},
            "send_16": {"ops_per_s": 500.0, "cpu_ms_per_message": cpu},
        }

    result = {
        "rounds": [
            {"mqmeta": phases(p50, cpu), "mqmeta-baseline": phases(2 * p50, 2 * cpu)}
            for p50, cpu in ((1.0, 0.9), (3.0, 1.0), (2.0, 5.0))
        ]
    }
    sends.summarize(result)
    assert result["summary"]["mqmeta"]["master_cpu_ms_per_message_1"] == 1.0
    assert result["ratios"]["send_p50_ms_vs_baseline"] == 0.5
    assert result["ratios"]["master_cpu_ms_per_message_1_vs_baseline"] == 0.5
    assert result["ratios"]["slave1_cpu_ms_per_message_16_vs_baseline"] == 1.0
    with pytest.raises(SystemExit) as exit_info:
        sends.parse_args(["--baseline-python", "/nonexistent/python"])
    assert exit_info.value.code == 2


def test_sends_majority_ratios_divide_by_rabbitmq_and_by_the_majority_cluster() -> None:
    """bench.peers.sends --compare-majority: the majority-acks cluster's medians are divided
    by RabbitMQ's, and the default (every SyncStateSet member) by the majority's; the
    majority cluster's brokers get the flags that make 2 of 3 copies an acknowledgement,
    and its settings in the JSON say so."""
    from bench import brokerlib
    from bench.peers import sends

    def phases(p50: float, rate: float) -> dict:
        return {"send_1": {"p50_ms": p50, "ops_per_s": 100.0}, "send_16": {"ops_per_s": rate}}

    result = {
        "rounds": [
            {"mqmeta": phases(a, 800), sends.MAJORITY: phases(b, 1000), "rabbitmq": phases(c, 2000)}
            for a, b, c in ((2.0, 1.0, 1.6), (3.0, 1.5, 2.0), (1.8, 1.2, 1.5))
        ]
    }
    sends.summarize(result)
    ratios = result["ratios"]
    assert ratios["majority_send_p50_vs_rabbitmq"] == 0.75  # 1.2 / 1.6
    assert ratios["majority_sends_per_s_16_vs_rabbitmq"] == 0.5
    assert ratios["send_p50_all_vs_majority"] == round(2.0 / 1.2, 3)
    assert ratios["sends_per_s_16_all_vs_majority"] == 0.8
    assert sends.parse_args(["--compare-majority"]).compare_majority
    assert sends.MAJORITY_FLAGS == ["--no-all-ack", "--in-sync-replicas", "2"]
    assert brokerlib.ack_policy([*brokerlib.FLAGS, *sends.MAJORITY_FLAGS]).startswith("2 copies")
    assert brokerlib.ack_policy(brokerlib.FLAGS).startswith("all SyncStateSet members")


def test_only_metadata_keeps_etcd_alone_and_the_metadata_ratios() -> None:
    """bench.peers --only metadata: etcd is the only peer started whatever --peers names,
    an unknown phase is exit 2, and `ratios` keeps the names the issue lists (the message
    ones are None without message rounds)."""
    args = run.parse_args(["--quick", "--only", "metadata", "--peers", "etcd,rabbitmq,nats"])
    assert args.peers == "etcd" and args.only == "metadata"
    with pytest.raises(SystemExit) as exit_info:
        run.parse_args(["--only", "messages"])
    assert exit_info.value.code == 2

    def metadata(write_ms: float, read_ms: float, rate: float) -> dict:
        return {
            "write_1": {"p50_ms": write_ms},
            "read_1": {"p50_ms": read_ms},
            "write_16": {"ops_per_s": rate},
            "write_16x32": {"ops_per_s": rate * 4},
        }

    result: dict = {
        "metadata_rounds": [
            {"mqmeta": metadata(3.0, 1.5, 800), "etcd": metadata(1.0, 0.5, 2000)},
            {"mqmeta": metadata(5.0, 1.7, 700), "etcd": metadata(1.0, 0.5, 2000)},
        ],
        "message_rounds": [],
    }
    run.summarize(result)
    ratios = result["ratios"]
    assert ratios["metadata_write_p50_vs_etcd"] == 4.0
    assert ratios["metadata_read_p50_vs_etcd"] == 3.2
    assert ratios["metadata_writes_per_s_16_vs_etcd"] == 0.375
    assert ratios["send_p50_vs_rabbitmq"] is None and ratios["sends_per_s_16_vs_rabbitmq"] is None


def test_ratios_by_round_pair_each_rounds_figures_and_skip_a_round_without_both() -> None:
    """bench.peers: `ratios_by_round` divides mqmeta's figure by the peer's of the same
    round and takes the median of those; `ratios` (medians of each system's figures) stays
    as it was. On a machine whose speed moves between rounds the two differ: here mqmeta
    is 1.25 × etcd's rate in two rounds of three, which only the paired ratio says; and a
    round without both systems is left out of the pairs."""

    def metadata(rate: float) -> dict:
        return {
            "write_1": {"p50_ms": 2.0},
            "read_1": {"p50_ms": 1.0},
            "write_16": {"ops_per_s": rate},
            "write_16x32": {"ops_per_s": rate},
        }

    def messages(p50_ms: float | None) -> dict:
        send_1 = {"skipped": "not measured"} if p50_ms is None else {"p50_ms": p50_ms}
        return {"send_1": send_1, "send_16": {}, "send_4x32": {}}

    result: dict = {
        "metadata_rounds": [
            {"mqmeta": metadata(500), "etcd": metadata(400)},
            {"mqmeta": metadata(700), "etcd": metadata(800)},
            {"mqmeta": metadata(2000), "etcd": metadata(1600)},
            {"etcd": metadata(3000)},  # mqmeta's part of this round failed
        ],
        "message_rounds": [
            {"mqmeta": messages(3.0), "rabbitmq": messages(2.0)},
            {"mqmeta": messages(1.0), "rabbitmq": messages(None)},
        ],
    }
    run.summarize(result)
    assert result["ratios"]["metadata_writes_per_s_16_vs_etcd"] == 0.583  # 700 / 1200
    paired = result["ratios_by_round"]
    assert paired["metadata_writes_per_s_16_vs_etcd"] == {"median": 1.25, "rounds": [1.25, 0.875, 1.25]}
    assert paired["metadata_write_p50_vs_etcd"]["median"] == 1.0
    assert paired["send_p50_vs_rabbitmq"] == {"median": 1.5, "rounds": [1.5]}
    assert paired["sends_per_s_16_vs_rabbitmq"] == {"median": None, "rounds": []}


def test_the_placed_phase_gives_its_own_ratio_beside_the_headline_one() -> None:
    """bench.peers: the one-producer phase with the nodes placed alike (`send_1_placed`)
    has its own figure and ratio, medians over the rounds and paired by round, and leaves
    `send_p50_vs_rabbitmq` to `send_1`; a round that skipped it (one CPU) or predates it
    is left out of its pairs."""

    def messages(p50_ms: float, placed_ms: float | None) -> dict:
        out = {"send_1": {"p50_ms": p50_ms}, "send_16": {}, "send_4x32": {}}
        if placed_ms is not None:
            out["send_1_placed"] = {"p50_ms": placed_ms}
        return out

    result: dict = {
        "message_rounds": [
            {"mqmeta": messages(1.2, 1.0), "rabbitmq": messages(1.0, 1.0)},
            {"mqmeta": messages(1.3, 0.9), "rabbitmq": messages(1.1, 1.0)},
            {
                "mqmeta": messages(1.1, None),
                "rabbitmq": {**messages(1.0, None), "send_1_placed": {"skipped": "one CPU"}},
            },
        ],
    }
    run.summarize(result)
    assert result["figures"]["mqmeta"]["send_p50_ms_placed_alike"] == 0.95
    assert result["ratios"]["send_p50_vs_rabbitmq_placed_alike"] == 0.95
    assert result["ratios"]["send_p50_vs_rabbitmq"] == 1.2
    assert result["ratios_by_round"]["send_p50_vs_rabbitmq_placed_alike"] == {
        "median": 0.95,
        "rounds": [1.0, 0.9],
    }
    # a system the phase leaves out is not measured, and says why
    skipped = run.placed_alike("nats", object(), lambda: pytest.fail("measured unplaced"))
    assert set(skipped) == {"skipped"} and skipped["skipped"]


def _affinities(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(tid) for tid in placement.threads_of(pid)]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placing needs two CPUs")
def test_placed_pins_every_thread_of_each_node_and_the_generator_then_puts_them_back() -> None:
    """placement.placed: each node's every thread on its CPU (the leader first: 0, 1, 0
    with two), this thread and the threads it starts on the next (1); afterwards, also
    after an error inside, every one of them back on all CPUs, a thread the phase started
    and left running included."""
    cpus = placement.usable_cpus()
    code = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    nodes = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(3)]
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 10
        while any(len(placement.threads_of(n.pid)) < 2 for n in nodes):
            assert time.monotonic() < deadline, "the child processes did not start their threads"
            time.sleep(0.02)
        expected, generator = placement.layout(cpus)
        places = [cpus[0], cpus[1], cpus[2 % len(cpus)]]
        assert expected == [{cpu} for cpu in places] and generator == {cpus[3 % len(cpus)]}
        seen: list[set[int]] = []
        left_running = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)) or stop.wait(30))
        with pytest.raises(RuntimeError, match="inside"), placement.placed([n.pid for n in nodes]):
            for node, cpu in zip(nodes, places, strict=True):
                affinities = _affinities(node.pid)
                assert len(affinities) >= 2 and all(a == {cpu} for a in affinities)
            left_running.start()
            assert os.sched_getaffinity(0) == generator
            raise RuntimeError("an error inside the phase")
        assert seen == [generator]
        assert os.sched_getaffinity(0) == set(cpus)
        assert os.sched_getaffinity(left_running.native_id) == set(cpus)
        for node in nodes:
            assert all(a == set(cpus) for a in _affinities(node.pid))
    finally:
        stop.set()
        for node in nodes:
            node.kill()
            node.wait()
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        placement.layout([0])


def test_awake_spins_one_idle_process_per_cpu_then_stops_each() -> None:
    """placement.awake: one spinner per usable CPU, pinned to it and at SCHED_IDLE (any
    real work takes the CPU from it), each spinning before the block runs; afterwards,
    also after an error inside, every spinner has ended."""
    cpus = placement.usable_cpus()
    with pytest.raises(RuntimeError, match="inside"), placement.awake(max_s=60) as pids:
        assert len(pids) == len(cpus) and set(pids) <= placement.RUNNING
        assert sorted(cpu for pid in pids for cpu in os.sched_getaffinity(pid)) == cpus
        assert all(os.sched_getscheduler(pid) == os.SCHED_IDLE for pid in pids)
        ran = [_run_ns(pid) for pid in pids]
        deadline = time.monotonic() + 10  # at SCHED_IDLE they run only on a CPU nothing else wants
        while not all(_run_ns(pid) > before for pid, before in zip(pids, ran, strict=True)):
            assert time.monotonic() < deadline, "a spinner did not run"
            time.sleep(0.05)
        raise RuntimeError("an error inside the phase")
    assert not any(_alive(pid) for pid in pids), pids
    assert not placement.RUNNING


def test_a_phase_without_every_vcpu_awake_is_left_out_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.peers.sends: the awake phase's figures, or {"skipped": why} when a spinner
    ended before the phase did (it then did not run with every vCPU awake) or never
    started spinning; no spinner is left running either way."""
    from bench.peers import sends

    assert sends.awake_phase(lambda: {"p50_ms": 1.0}, max_s=30) == {"p50_ms": 1.0}
    ended = sends.awake_phase(lambda: time.sleep(2.0) or {"p50_ms": 1.0}, max_s=0.5)
    assert "ended before the phase did" in ended["skipped"], ended
    monkeypatch.setattr(placement, "_SPIN", "import sys; sys.exit(3)")
    never = sends.awake_phase(lambda: pytest.fail("measured without spinners"), max_s=30)
    assert "did not start spinning" in never["skipped"] and "exit code 3" in never["skipped"], never
    assert not placement.RUNNING


def test_a_round_measures_the_awake_phase_while_the_spinners_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.peers.sends: with `awake`, each system's round measures one producer a second
    time, and that measurement runs while every CPU's spinner does (none before or after)."""
    from bench.peers import sends

    calls: list[tuple[str, int, int]] = []  # (system, producers, spinners running)

    def drive(system: str, send: object, threads: int, duration_s: float) -> dict:
        calls.append((system, threads, len(placement.RUNNING)))
        return {"p50_ms": 1.0, "ops_per_s": 10.0}

    monkeypatch.setattr(sends, "_send_client", lambda name, system: name)
    monkeypatch.setattr(sends, "_drive_with_cpu", drive)
    out = sends._round(
        {"mqmeta": "mqmeta", "rabbitmq": "rabbitmq"}, ["mqmeta", "rabbitmq"], 1.0, False, awake=True
    )
    cpus = len(placement.usable_cpus())
    assert calls == [(s, n, k) for s in ("mqmeta", "rabbitmq") for n, k in ((1, 0), (16, 0), (1, cpus))]
    assert all(out[s]["send_1_awake"] == {"p50_ms": 1.0, "ops_per_s": 10.0} for s in out)
    assert "send_1_awake" not in sends._round({"mqmeta": "mqmeta"}, ["mqmeta"], 1.0, False)["mqmeta"]
    assert not placement.RUNNING


def _run_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])  # time on a CPU, ns


def test_a_round_runs_each_phase_on_every_system_before_the_next_phase() -> None:
    """bench.peers: within a round the phases go side by side (mqmeta's one writer, then
    etcd's, then 16 writers on each), so the two figures of a ratio are seconds apart."""
    calls: list[tuple[str, str]] = []

    def phase(label: str):
        return lambda name: calls.append((label, name)) or {"phase": label, "system": name}

    out = run._side_by_side(["mqmeta", "etcd"], {"write_1": phase("write_1"), "write_16": phase("write_16")})
    assert calls == [("write_1", "mqmeta"), ("write_1", "etcd"), ("write_16", "mqmeta"), ("write_16", "etcd")]
    assert out["etcd"]["write_16"] == {"phase": "write_16", "system": "etcd"}
    assert list(out) == ["mqmeta", "etcd"] and list(out["mqmeta"]) == ["write_1", "write_16"]


def test_ab_ratios_are_medians_of_per_turn_ratios_and_bad_clusters_are_refused(tmp_path: Path) -> None:
    """bench.peers.ab: a cluster's ratio is the median of its figure divided by the
    reference's in the same turn (a drifting machine moves both), not a ratio of medians;
    fewer than two clusters, a name twice or an interpreter that is no executable file end
    argparse with exit 2."""
    from bench.peers import ab

    figures = {"new": [1.0, 2.0, 4.0, None], "old": [2.0, 2.0, 2.0, 2.0]}
    summary = ab.paired(figures, "old")
    assert summary["new"] == {"median": 2.0, "ratio_to_old": 1.0, "turns_without_figure": 1}
    figures = {"old": [1.0, 3.0, 5.0], "new": [0.9, 2.7, 4.5]}
    assert ab.paired(figures, "old")["new"]["ratio_to_old"] == 0.9
    python = sys.executable
    assert ab.parse_args([f"a={python}", f"b={python}"]).pythons == {"a": python, "b": python}
    assert ab.parse_args([f"a={python}", f"b={python}", "--each", "2"]).copies == {
        "a": ["a", "a-2"],
        "b": ["b", "b-2"],
    }
    for argv in (
        [f"a={python}"],
        [f"a={python}", f"a={python}"],
        [f"a={python}", "b=/nonexistent/python"],
        [f"a={python}", f"a-2={python}", "--each", "2"],  # a's second copy is a-2
        [f"a={python}", f"b={python}", "--each", "5"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            ab.parse_args(argv)
        assert exit_info.value.code == 2


def test_ab_pools_each_names_copies_per_turn_and_gives_their_spread() -> None:
    """bench.peers.ab --each: a NAME's figure in a turn is the mean of its copies'; its
    ratio is the median over turns of that divided by the reference NAME's; `within` is
    the median of each later copy divided by the first (identical code). A turn where a
    copy has no figure counts in neither."""
    from bench.peers import ab

    copies = {"old": ["old", "old-2"], "new": ["new", "new-2"]}
    figures = {
        "old": [2.0, 1.0, 2.0, 2.0],
        "old-2": [1.0, 1.0, 2.0, None],
        "new": [1.0, 1.0, 1.0, 1.0],
        "new-2": [2.0, 0.5, 1.5, 1.0],
    }
    out = ab.pooled(figures, copies, "old")
    assert out["old"] == {"ratio_to_old": 1.0, "within": 1.0}  # 0.5, 1.0, 1.0 of old
    # new / old by turn: 1.5/1.5, 0.75/1.0, 1.25/2.0 (the fourth lacks old-2): 0.75
    assert out["new"] == {"ratio_to_old": 0.75, "within": 1.25}  # of 2.0, 0.5, 1.5, 1.0


def test_ab_metadata_turns_drive_metadata_writers_of_the_cluster() -> None:
    """bench.peers.ab --metadata: each turn's clients are CreateTopic writers to that
    cluster's controllers (bench/peers/load.py's MqmetaWrite), not producers."""
    import types

    from bench.peers import ab, load

    python = sys.executable
    args = ab.parse_args([f"a={python}", f"b={python}", "--metadata", "--producers", "16"])
    assert args.metadata and args.producers == 16
    factory = ab._client(args, types.SimpleNamespace(addresses=["127.0.0.1:1"]))  # type: ignore[arg-type]
    assert factory.func is load.MqmetaWrite and factory.args == (["127.0.0.1:1"],)
    assert not ab.parse_args([f"a={python}", f"b={python}"]).metadata


def test_machine_cpu_per_op_is_the_busy_ticks_of_every_core_over_the_measured_seconds() -> None:
    """load.machine_cpu: user, nice, system, irq and softirq ticks (not idle, iowait or
    steal) in ms per operation, with the idle and stolen shares; nothing without two
    readings or operations. drive() measures it over the seconds it counts (after the
    warm-up): a client that burns CPU for 2 ms a call costs the machine at least 2 ms a
    call, and a ratio of it against the peer is in `ratios`."""
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    before = [100, 0, 50, 1000, 10, 0, 0, 5]
    after = [100 + 300, 0, 50 + 100, 1000 + 550, 10 + 30, 0 + 10, 0 + 10, 5 + 0]  # 420 busy of 1000
    figures = load.machine_cpu(before, after, ops=42)
    assert figures["machine_cpu_ms_per_op"] == round(420 * tick_ms / 42, 3)
    assert figures["machine_idle_percent"] == 58.0 and figures["machine_steal_percent"] == 0.0
    after[7] += 1000  # the hypervisor took as many ticks again
    stolen = load.machine_cpu(before, after, ops=42)
    assert stolen["machine_steal_percent"] == 50.0
    assert stolen["machine_cpu_ms_per_op"] == figures["machine_cpu_ms_per_op"], "steal is not our CPU"
    guests = load.machine_cpu([*before, 7, 0], [*after, 7 + 300, 0], ops=42)  # guest ticks: already in user
    assert guests == load.machine_cpu(before, after, ops=42), guests
    assert load.machine_cpu(None, after, 42) == {} and load.machine_cpu(before, before, 42) == {}
    assert load.machine_cpu(before, after, 0)["machine_cpu_ms_per_op"] is None

    class Burner:
        def call(self) -> None:
            end = time.thread_time() + 0.002
            while time.thread_time() < end:
                pass

        def close(self) -> None:
            pass

    measured = load.drive(lambda k: Burner(), 1, 0.2, 1.0)
    assert measured["count"] > 50, measured
    # /proc/stat counts whole ticks per CPU (10 ms here): over a second, a tick or two either
    # way (2.0 once read as 1.988 ms a call), hence 5 % below the burner's own 2 ms.
    assert 1.9 <= measured["machine_cpu_ms_per_op"] < 20.0, measured

    def metadata(cpu_ms: float) -> dict:
        write_16 = {"ops_per_s": 1000, "machine_cpu_ms_per_op": cpu_ms}
        return {"write_1": {}, "read_1": {}, "write_16": write_16, "write_16x32": {}}

    def messages(cpu_ms: float) -> dict:
        return {
            "send_1": {},
            "send_16": {"ops_per_s": 1000, "machine_cpu_ms_per_op": cpu_ms},
            "send_4x32": {},
        }

    result: dict = {
        "metadata_rounds": [{"mqmeta": metadata(1.2), "etcd": metadata(0.6)}],
        "message_rounds": [{"mqmeta": messages(0.7), "rabbitmq": messages(1.0)}],
    }
    run.summarize(result)
    assert result["figures"]["mqmeta"]["send_machine_cpu_ms_per_message_16"] == 0.7
    assert result["ratios"]["metadata_machine_cpu_per_write_16_vs_etcd"] == 2.0
    assert result["ratios"]["send_machine_cpu_per_message_16_vs_rabbitmq"] == 0.7
    assert result["ratios_by_round"]["send_machine_cpu_per_message_16_vs_rabbitmq"]["rounds"] == [0.7]
