"""What a controller node holds in memory when idle: a real `mqmeta controller` (with a Raft
secret and no metrics endpoint, as the benchmark runs it) serving in a fresh interpreter.

Properties checked:
- the node's idle import set has none of the modules it does not use at idle: cryptography
  (the Raft ciphers run over Python's libcrypto: controller/raft_ciphers.py), the parts of
  other commands (brokers, the console, the RocketMQ proxy and remoting, chaos, Spark),
  server reflection's modules and protobuf's descriptor_pb2 (imported on the first
  reflection call), difflib (only for a configuration mistake), prometheus-client (only
  with --metrics-listen: tests/test_metrics.py scrapes nodes that serve it);
- its resident memory stays under a bound with a wide margin (a regrown import set or a
  leak at start would cross it);
- server reflection still answers on the node (async server) and then has its modules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mqmeta.cluster.ports import PortReservation

from tests.support.checks_process import ROOT

pytestmark = pytest.mark.timeout(90)

# The node measured 49-53 MB on the machine of docs/benchmarks.md ("Restart to serving, and
# idle memory"); before the Raft ciphers left cryptography it measured 62 MB.
IDLE_RSS_MB_MAX = 60.0

NOT_AT_IDLE = (
    "cryptography",
    "aiohttp",
    "pyspark",
    "py4j",
    "difflib",
    "prometheus_client",
    "google.protobuf.descriptor_pb2",
    "grpc_reflection.v1alpha.reflection",
    "mqmeta.broker_agent",
    "mqmeta.chaos",
    "mqmeta.spark",
    "mqmeta.remoting",
    "mqmeta.rocketmq",
    "mqmeta.controller.console",
    "mqmeta.controller.rmq_proxy",
    "mqmeta.controller.remoting_proxy",
    "mqmeta.controller.namesrv_remoting",
    "mqmeta.admin_cli",
    "mqmeta.data_cli",
)

SCRIPT = """
import json, os, signal, sys, threading, time
import mqmeta.cli

grpc_address, raft, data_dir, secret = sys.argv[1:]
IDLE_S = 1.0
DEADLINE_S = 40.0


def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024


def watch():
    from mqmeta.client import ControllerClient
    from mqmeta.pb import controller_pb2 as pb

    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            with ControllerClient([grpc_address], timeout_s=2) as client:
                client.get_config(pb.GetConfigRequest(), timeout_s=2)
            break
        except Exception:
            time.sleep(0.1)
    time.sleep(IDLE_S)
    found = {"modules": sorted(sys.modules), "rss_mb": rss_mb()}
    import grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(grpc_address) as channel:
        answers = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        found["reflected"] = sorted(s.name for a in answers for s in a.list_services_response.service)
    found["modules_after_reflection"] = sorted(sys.modules)
    print(json.dumps(found), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=watch, daemon=True).start()
sys.exit(mqmeta.cli.main([
    "--log-level", "WARNING", "controller", "--id", "c1", "--grpc", grpc_address, "--raft", raft,
    "--peer", f"c1={raft}/{grpc_address}", "--data-dir", data_dir,
    "--secret-file", secret,
]))
"""


def test_an_idle_controller_holds_only_what_it_uses(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("a secret of the test")
    with PortReservation.pick(2) as ports:
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT, *ports.addresses, str(tmp_path / "data"), str(secret)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    modules = found["modules"]
    held = sorted(m for m in modules if any(m == name or m.startswith(name + ".") for name in NOT_AT_IDLE))
    assert not held, f"an idle controller imported {held}"
    assert found["rss_mb"] < IDLE_RSS_MB_MAX, f"idle controller RSS {found['rss_mb']:.1f} MB"
    assert "mqmeta.v1.ControllerService" in found["reflected"]
    assert "grpc.reflection.v1alpha.ServerReflection" in found["reflected"]
    assert "grpc_reflection.v1alpha.reflection" in found["modules_after_reflection"]


def test_reflection_answers_on_a_thread_pool_server_too():
    """add_health_and_reflection on a grpc.Server (the broker's kind), as on the node's
    AsyncServer above: the lazily built servicer lists every service and serves a file."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    from mqmeta.rpc import REFLECTION_SERVICE, add_health_and_reflection

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    add_health_and_reflection(server, ["mqmeta.v1.ControllerService"])
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            requests = [
                reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="mqmeta.v1.ControllerService"),
            ]
            listed, found = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter(requests), timeout=5
            )
    finally:
        server.stop(None)
    names = {s.name for s in listed.list_services_response.service}
    assert names == {"mqmeta.v1.ControllerService", "grpc.health.v1.Health", REFLECTION_SERVICE}
    assert found.file_descriptor_response.file_descriptor_proto, found
