"""A controller leader stopped past dead-after and resumed deposes no healthy master.

Property checked, with 3 real controller processes and one broker set of 2 replicas (the
harness's test liveness: heartbeats every 200 ms, dead after 1 s): the leader is stopped
(SIGSTOP) for 3 s, the two others elect a new leader and the brokers heartbeat to it; on
SIGCONT, the old leader's liveness scan may run on its own 3-s-old view (every broker
silent) before it hears of the new term, and propose an election. That proposal carries
the term its view belongs to, and the state machine refuses it in any later term
(`state_machine.stale_view`), so the master and its epoch stay as they were for the
whole window after the resume. Found by the chaos matrix's false-failover checker
(fixed-suspend with the default liveness). The applied logs must also show every
liveness-built command committed in the term of its view.
"""

from __future__ import annotations

import json

import pytest

from cluster.harness import Cluster
from mqmeta.pb import controller_pb2 as pb
from tests.support import wait_for
from tests.support.sampling import sample_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

PAUSE_S = 3.0  # three times the test dead-after
WATCH_AFTER_RESUME_S = 3.0
ROUNDS = 2


def _replica_info(cluster: Cluster) -> pb.ReplicaInfo:
    with cluster.client(timeout_s=5.0) as client:
        return client.call(
            "GetReplicaInfo", pb.BrokerSetRef(cluster="DefaultCluster", broker_name="broker-a")
        )


def _liveness_entries(cluster: Cluster) -> list[tuple[int, int, int]]:
    """(index, entry term, view term) of every applied command that carries a view's term."""
    seen = []
    for node in cluster.layout.controllers:
        path = cluster.root / "controllers" / node.id / "applied.jsonl"
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            for command in entry.get("commands") or []:
                if "leader_term" in command:
                    seen.append((entry["index"], entry["term"], command["leader_term"]))
    return seen


def test_a_resumed_stale_leader_deposes_no_master(tmp_path):
    cluster = Cluster(tmp_path, count=3, broker_sets=1, replicas=2)
    try:
        cluster.start()
        cluster.master_of("broker-a", timeout_s=30.0)
        before = wait_for(
            lambda: (info := _replica_info(cluster)).master_broker_id and info,
            20.0,
            "broker-a with a master",
        )
        for _ in range(ROUNDS):
            leader = cluster.leader_id()
            cluster.pause(leader)
            try:
                cluster.leader_id(timeout_s=20.0, exclude=leader)
                for _ in sample_for(PAUSE_S, 0.2):  # the fault's length: the stopped view ages
                    pass
            finally:
                cluster.resume(leader)
            for _ in sample_for(WATCH_AFTER_RESUME_S, 0.1, samples_min=5):
                info = _replica_info(cluster)
                assert (info.master_broker_id, info.master_epoch) == (
                    before.master_broker_id,
                    before.master_epoch,
                ), f"master changed after {leader} resumed: {info}"
        committed = _liveness_entries(cluster)
        stale = [e for e in committed if e[1] != e[2]]
        print(
            f"liveness-built commands in the applied logs: {len(committed)}, of an older view: {len(stale)}"
        )
    finally:
        cluster.stop()
