"""Reading and waiting on the controllers of a real cluster (cluster.harness.Cluster)."""

from __future__ import annotations

from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.wait import wait_for

from mqmeta.pb import controller_pb2 as pb

CONVERGE_TIMEOUT_S = 10.0


def topic_names(cluster: Cluster, node_id: str) -> set[str]:
    """The topics one node lists (a linearizable read through that node)."""
    with cluster.client([node_id]) as client:
        return {t.name for t in client.call("ListTopics", pb.ListTopicsRequest()).topics}


def wait_same_digest(cluster: Cluster, node_ids: list[str], timeout_s: float = CONVERGE_TIMEOUT_S) -> str:
    """Waits until the nodes have applied the same index with the same state digest; returns it."""

    def applied() -> dict[str, tuple[int, str]]:
        metas = [cluster.metadata(n) for n in node_ids]
        return {m.node_id: (m.last_applied, m.state_digest) for m in metas}

    converged = wait_for(
        applied,
        timeout_s,
        f"{', '.join(node_ids)} to converge (last applied index, state digest)",
        until=lambda found: len(set(found.values())) == 1,
    )
    return next(iter(converged.values()))[1]
