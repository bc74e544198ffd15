"""The false-failover checker (chaos/failover.py) on hand-made histories.

Property checked: a master change of a broker set is reported as a false failover exactly when
no injected fault touched the master the set had at the fault's start (kill, suspend, or a cut
link of it) between that fault's start and its heal plus the grace window; delays and losses
never excuse one; the master timeline is read from the controllers' applied.jsonl (the union of
the nodes' logs, the first master not counted as a change, a re-election at a new epoch counted);
electing a master for a set left without one is a recovery, never a false failover; a change
made once the runner began stopping the cluster is not judged.
"""

from __future__ import annotations

from pathlib import Path

from mqmeta.chaos.failover import (
    GRACE_AFTER_FAULT_MS,
    MasterChange,
    check_false_failovers,
    master_timeline,
    touches,
)

from mqmeta.formats.jsonlines import format_line


def _fault(kind: str, start_ms: int, end_ms: int, affected=(), cut=()) -> dict:
    return {
        "fault": kind,
        "start_ms": start_ms,
        "end_ms": end_ms,
        "affected": list(affected),
        "cut": list(cut),
    }


def test_a_change_while_the_master_is_killed_is_excused_and_timed():
    changes = [MasterChange(11_000, 2, "b2", "b1")]
    result = check_false_failovers(changes, "b1", [_fault("leader-kill", 10_000, 20_000, ["b1"])])
    assert result["falseFailoverCount"] == 0
    assert result["failoverMs"] == [1_000]
    assert result["faultsTouchingMaster"] == 1


def test_a_change_with_no_fault_at_all_is_false():
    result = check_false_failovers([MasterChange(5_000, 2, "b2", "b1")], "b1", [])
    assert result["falseFailoverCount"] == 1
    assert result["falseFailovers"][0]["master"] == "b2"


def test_a_fault_on_a_slave_or_a_controller_does_not_excuse_a_change():
    faults = [
        _fault("random-kill", 10_000, 20_000, ["b2"]),
        _fault("leader-suspend", 30_000, 40_000, ["c1"]),
        _fault("random-partition", 50_000, 60_000, ["c2"], cut=[("c2", "c1"), ("c2", "b2")]),
    ]
    changes = [MasterChange(t, e, "b3", "b1") for e, t in ((2, 12_000), (3, 35_000), (4, 55_000))]
    result = check_false_failovers(changes, "b1", faults)
    assert result["falseFailoverCount"] == 3
    assert result["faultsTouchingMaster"] == 0


def test_a_cut_link_of_the_master_excuses_a_change_until_the_grace_window_ends():
    cut = _fault("leader-partition", 10_000, 20_000, ["b1"], cut=[("b1", "c1"), ("b1", "c2")])
    inside = MasterChange(20_000 + GRACE_AFTER_FAULT_MS, 2, "b2", "b1")
    after = MasterChange(20_001 + GRACE_AFTER_FAULT_MS, 3, "b3", "b2")
    before = MasterChange(9_999, 2, "b2", "b1")
    assert check_false_failovers([inside], "b1", [cut])["falseFailoverCount"] == 0
    late = check_false_failovers([inside, after], "b1", [cut])
    assert [c["epoch"] for c in late["falseFailovers"]] == [3]
    assert check_false_failovers([before], "b1", [cut])["falseFailoverCount"] == 1


def test_the_master_touched_is_the_one_at_the_faults_start():
    """After b2 took over, killing b1 (now a slave) excuses nothing."""
    changes = [MasterChange(11_000, 2, "b2", "b1"), MasterChange(41_000, 3, "b3", "b2")]
    faults = [_fault("fixed-kill", 10_000, 20_000, ["b1"]), _fault("fixed-kill", 40_000, 50_000, ["b1"])]
    result = check_false_failovers(changes, "b1", faults)
    assert [c["epoch"] for c in result["falseFailovers"]] == [3]
    assert result["failoverMs"] == [1_000]


def test_electing_a_master_for_a_set_that_has_none_is_a_recovery_not_a_failover():
    """Every broker killed: the master is cleared in the fault; the restarted brokers elect one
    only after the grace window on a slow machine. That election replaces no master."""
    changes = [
        MasterChange(11_000, 2, "", "b1"),
        MasterChange(20_000 + GRACE_AFTER_FAULT_MS + 500, 3, "b2", ""),
    ]
    result = check_false_failovers(changes, "b1", [_fault("all-kill", 10_000, 20_000, ["b1", "b2", "b3"])])
    assert result["falseFailoverCount"] == 0
    later = MasterChange(20_000 + GRACE_AFTER_FAULT_MS + 900, 4, "b3", "b2")  # but replacing b2 is one
    assert (
        check_false_failovers([*changes, later], "b1", [_fault("all-kill", 10_000, 20_000, ["b1"])])[
            "falseFailoverCount"
        ]
        == 1
    )


def test_delay_and_loss_never_touch_and_all_kill_always_does():
    master = "b1"
    assert not touches(_fault("random-delay", 0, 1, ["b1", "c1"]), master)
    assert not touches(_fault("random-loss", 0, 1, ["b1", "c1"]), master)
    assert touches(_fault("all-kill", 0, 1, ["c1", "b1"]), master)
    assert touches(_fault("bridge", 0, 1, ["b1"], cut=[("b1", "c3")]), master)
    assert not touches(_fault("bridge", 0, 1, ["b1"], cut=[("b2", "c3")]), master)
    assert not touches(_fault("leader-kill", 0, 1, ["b1"]), "")  # no master: nothing to touch


def test_the_disk_faults_touch_the_node_whose_disk_they_hit():
    for kind in ("power-loss-node", "power-loss-all", "slow-disk", "fsync-eio"):
        assert touches(_fault(kind, 0, 1, ["b1"]), "b1"), kind
        assert not touches(_fault(kind, 0, 1, ["b2"]), "b1"), kind
    # a full disk only refuses writes; a slow replica or a stepped clock never excuse a change
    for kind in ("disk-full", "slow-replica", "clock-jump"):
        assert not touches(_fault(kind, 0, 1, ["b1"]), "b1"), kind


def _line(index: int, now_ms: int, epoch: int, master_id: int) -> bytes:
    replicas = {str(i): {"address": f"127.0.0.1:{9000 + i}"} for i in (1, 2, 3)}
    value = {"master_epoch": epoch, "master_broker_id": master_id, "replicas": replicas}
    command = {"type": "elect_master", "now_ms": now_ms}
    return format_line(
        {"index": index, "commands": [command], "effects": {"brokerset/DefaultCluster/broker-a": value}}
    )


def test_master_timeline_reads_the_union_of_the_controllers_logs(tmp_path: Path):
    one, two = tmp_path / "c1.jsonl", tmp_path / "c2.jsonl"
    one.write_bytes(_line(1, 1_000, 1, 1) + _line(2, 2_000, 2, 2))  # killed part-way: a prefix
    two.write_bytes(_line(1, 1_000, 1, 1) + _line(2, 2_000, 2, 2) + _line(3, 3_000, 3, 2) + b"{torn")
    names = {f"127.0.0.1:{9000 + i}": f"broker-a-{i}" for i in (1, 2, 3)}
    timeline = master_timeline([one, two], "broker-a", names)
    assert [(c.at_ms, c.epoch, c.master, c.previous) for c in timeline] == [
        (1_000, 1, "broker-a-1", ""),
        (2_000, 2, "broker-a-2", "broker-a-1"),
        (3_000, 3, "broker-a-2", "broker-a-2"),  # the same broker at a new epoch: its clients moved
    ]
    assert master_timeline([one], "broker-b", names) == []


def test_a_change_after_the_runner_began_stopping_the_cluster_is_not_judged(tmp_path: Path):
    """The stop signals brokers and controllers in turn: a master that stops first is
    replaced, at the run's end, by no fault's doing and by no fault of the system's."""
    from types import SimpleNamespace

    from mqmeta.chaos.failover import check_run

    (tmp_path / "c1").mkdir()
    (tmp_path / "c1" / "applied.jsonl").write_bytes(_line(1, 1_000, 1, 1) + _line(2, 9_000, 2, 2))
    layout = SimpleNamespace(
        brokers=[SimpleNamespace(grpc=f"127.0.0.1:{9000 + i}", name=f"broker-a-{i}") for i in (1, 2, 3)]
    )
    judged = check_run(tmp_path, layout, [], "broker-a")
    assert judged["falseFailoverCount"] == 1  # without the stop's time, it looks false
    result = check_run(tmp_path, layout, [], "broker-a", stopped_ms=8_500)
    assert result["falseFailoverCount"] == 0 and result["masterChangeCount"] == 0
