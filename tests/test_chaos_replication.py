"""The replication chaos workload (`mqmeta chaos run --workload replication`), through real
processes: clusters a and b, two replicator workers, a fault proxy on the link to b.

Properties checked:
- the short CI run (24 s, faults every 4 s): kill -9 of every worker (restarted at the heal)
  and a cut of the link between the sites, alternating, mid-stream; then every send a
  acknowledged is delivered at b after a bounded catch-up (0 lost), no source record is
  stored twice at b (0 duplicated by origin key and offset), per-key order at b and origin
  order per target queue hold, nothing at b lacks an origin, and both faults really hit;
- bad plans are refused in one sentence before anything starts (a fault at a place it
  cannot apply to, an unknown place);
- slow (not in CI): 72 s with every place in turn (source, target, link, workers); a
  power loss of every process of the target site (each node's data dir on its own fault
  filesystem mount): the copies the target acknowledged, and so the origin table the
  workers resume from, survive it (nothing lost, nothing copied twice), every node back;
  a corrupted slave at the target, repaired, a step of its controller's wall clock and a
  power loss of the source change nothing either;
- disk faults, corrupt-replica and clock-jump apply at source and target only; slow-replica
  is refused (a site has no proxies between its nodes).
The Spark check X1 is not run here (CI budget): `audit=False`.
"""

from __future__ import annotations

import json

import pytest
from mqmeta.chaos.runner import RunConfig, run

from mqmeta.errors import InvalidArgument

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

SHORT_TIME_S = 24.0
SHORT_INTERVAL_S = 4.0
ACKED_MIN = 100  # 20 sends/s for 24 s, with faults that never stop the source


def _assert_clean(outcome) -> None:
    result = outcome.result
    queue, replication = result["queue"], result["replication"]
    assert queue["enqueueSuccessCount"] >= ACKED_MIN, queue
    assert queue["lostMessageCount"] == 0, queue["lostMessages"]
    assert queue.get("unexpectedMessageCount", 0) == 0, queue
    assert replication["lostCount"] == 0, replication["lostValues"]
    assert replication["duplicatedByOrigin"] == 0, replication["duplicatedOrigins"]
    assert replication["originOrderViolations"] == 0 and replication["unexpectedCount"] == 0, replication
    assert replication["copyCount"] >= queue["enqueueSuccessCount"], replication
    assert result["order"]["isOrder"], result["order"]
    assert outcome.passed, outcome.failures


def test_worker_kills_and_link_cuts_lose_and_duplicate_nothing(tmp_path):
    config = RunConfig(
        fault="all-kill,random-partition",
        fault_target="workers,link",
        workload="replication",
        output_dir=tmp_path / "run",
        time_limit_s=SHORT_TIME_S,
        interval_s=SHORT_INTERVAL_S,
        audit=False,
    )
    outcome = run(config)
    faults = outcome.result["faults"]
    assert [f["place"] for f in faults] == ["workers", "link", "workers"], faults
    assert all(not f["what"].startswith("not injected") for f in faults), faults
    assert faults[0]["affected"] == ["w1", "w2"], faults[0]
    _assert_clean(outcome)
    written = json.loads((outcome.output_dir / "result.json").read_text())
    assert written["passed"] is True and written["replication"]["duplicatedByOrigin"] == 0


@pytest.mark.parametrize(
    "fault, target, words",
    [
        ("random-partition", "workers", "applies to none"),
        ("leader-kill", "link", "applies to none"),
        ("leader-kill", "workers", "applies to none"),
        ("random-kill", "moon", "--fault-target"),
        ("random-kill,nope", "all", "unknown fault"),
        ("slow-replica", "all", "does not take slow-replica"),
        ("clock-jump", "link", "applies to none"),
        ("corrupt-replica", "link", "applies to none"),
        ("power-loss-node", "workers", "applies to none"),
    ],
)
def test_bad_plans_are_refused_in_one_sentence(tmp_path, fault, target, words):
    config = RunConfig(fault=fault, fault_target=target, workload="replication", output_dir=tmp_path)
    with pytest.raises(InvalidArgument, match=words):
        config.validate()


@pytest.mark.slow
def test_every_place_in_turn_loses_and_duplicates_nothing(tmp_path):
    config = RunConfig(
        fault="leader-kill,random-partition,all-kill",
        fault_target="all",
        workload="replication",
        output_dir=tmp_path / "run",
        time_limit_s=72.0,
        interval_s=4.0,  # 9 rounds: each of the 3 faults at each place it takes
        audit=False,
    )
    outcome = run(config)
    places = {f["place"] for f in outcome.result["faults"]}
    assert places == {"source", "target", "link", "workers"}, outcome.result["faults"]
    _assert_clean(outcome)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_power_loss_a_corrupted_slave_and_a_clock_jump_at_the_sites_lose_and_duplicate_nothing(tmp_path):
    """Rounds: power-loss-all, corrupt-replica and clock-jump at the target, then the source
    (each fault takes the next place of the list that it applies to)."""
    config = RunConfig(
        fault="power-loss-all,corrupt-replica,clock-jump",
        fault_target="target,source",
        workload="replication",
        output_dir=tmp_path / "run",
        time_limit_s=48.0,
        interval_s=4.0,
        audit=False,
    )
    outcome = run(config)
    faults = outcome.result["faults"]
    assert [(f["fault"], f["place"]) for f in faults][:3] == [
        ("power-loss-all", "target"),
        ("corrupt-replica", "target"),
        ("clock-jump", "target"),
    ], faults
    assert faults[2]["clockStepMs"] == 30_000, faults[2]
    assert faults[0]["what"].startswith("target: power lost on"), faults[0]
    assert "pagesLost" in faults[0] and "notRestarted" not in faults[0], faults[0]
    assert all(count >= 1 for count in faults[1]["repaired"].values()) and faults[1]["repaired"], faults[1]
    assert outcome.result["notRestarted"] == [] and outcome.result["unrepaired"] == [], outcome.result
    assert all(
        c["power_losses"] >= 1 for n, c in outcome.result["faultfs"].items() if n.startswith("target:")
    )
    _assert_clean(outcome)
