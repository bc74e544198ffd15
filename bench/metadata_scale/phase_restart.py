"""Metadata at scale, phase restart: kill -9 of one node, then of all, and the time to serve again."""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.benchlib import (
    _r,
)
from bench.metadata_scale.cluster import ScaleCluster
from bench.metadata_scale.common import log
from bench.metadata_scale.phase_verify import same_digests

# Phase: restart ---------------------------------------------------------------------------------


def _until_serving(address: str, started: float, limit_s: float) -> dict[str, Any]:
    """Seconds from `started` until `address` answers GetMetadata (process up) and then a
    linearizable read (GetConfig: a barrier committed and applied on that node)."""
    from mqmeta.client import ControllerClient
    from mqmeta.errors import MqmetaError
    from mqmeta.pb import controller_pb2 as pb

    out: dict[str, Any] = {"answering_s": None, "serving_s": None}
    with ControllerClient([address], timeout_s=1.0) as client:
        for _ in range(100_000):
            if time.monotonic() - started > limit_s:
                break
            try:
                if out["answering_s"] is None:
                    client.get_metadata(pb.GetMetadataRequest())
                    out["answering_s"] = _r(time.monotonic() - started, 3)
                client.get_config(pb.GetConfigRequest())
                out["serving_s"] = _r(time.monotonic() - started, 3)
                return out
            except MqmetaError:
                time.sleep(0.02)
    return out


def restart_phase(cluster: ScaleCluster, args) -> dict[str, Any]:
    harness = cluster.harness
    out: dict[str, Any] = {"how": "kill -9, then start the same command on the same data"}
    follower = next(n for n in cluster.ids if n != cluster.leader())
    harness.kill(follower)
    t0 = time.monotonic()
    harness.start_node(follower)
    one = _until_serving(cluster.grpc(follower), t0, args.restart_s_max)
    out["one_node"] = dict(one, node=follower, role_before="follower")
    log(f"restart of {follower}: serving after {one['serving_s']} s")
    same_digests(cluster, timeout_s=60.0)
    for node in cluster.ids:
        harness.kill(node)
    t0 = time.monotonic()
    for node in cluster.ids:
        harness.start_node(node)
    results: dict[str, dict[str, Any]] = {}

    def wait(node: str) -> None:
        results[node] = _until_serving(cluster.grpc(node), t0, args.restart_s_max)

    threads = [threading.Thread(target=wait, args=(n,), daemon=True) for n in cluster.ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=args.restart_s_max + 30.0)
    serving = [r["serving_s"] for r in results.values()]
    out["all_nodes"] = {
        "by_node": results,
        "first_serving_s": min((s for s in serving if s is not None), default=None),
        "all_serving_s": None if None in serving or not serving else max(serving),
    }
    out["digests_after"] = same_digests(cluster, timeout_s=60.0)
    log(f"restart of all three: every node serving after {out['all_nodes']['all_serving_s']} s")
    out["node_log_lines"] = _startup_log_lines(cluster)
    return out


def _startup_log_lines(cluster: ScaleCluster) -> dict[str, list[str]]:
    """The controller's own account of its start (snapshot load, replay), if it logs one."""
    lines: dict[str, list[str]] = {}
    for node in cluster.ids:
        path = cluster.harness.root / "logs" / f"{node}.log"
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        lines[node] = [ln[-200:] for ln in text if "snapshot" in ln.lower() or "replay" in ln.lower()][-6:]
    return lines
