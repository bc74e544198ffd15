"""`--config FILE` of `mqmeta controller`, `namesrv`, `broker` and `replicator`.

Properties checked:
- a key sets its flag, a flag given on the command line wins over the file, and a flag in
  neither keeps its default (switches and repeated flags too); a flag added to a parser
  after accept_config_file() (so no key could set it) fails loudly;
- an unknown key is refused by name (with the known keys), a key of the wrong type is
  refused by name, bad TOML is refused with its line, a missing or unreadable file is
  refused: exit 2, one sentence, never a value of the file;
- every sample file in deploy/ loads with no unknown key;
- the standalone sample deployment (3 controllers, a nameserver, a broker set of 3), its
  addresses moved to loopback ports and its directories into tmp_path, starts: the
  controllers elect a leader, the broker set a master, a send is acknowledged; and a
  flag given beside a sample file overrides it in the real process;
- the embedded samples (3 nameservers, each with a controller), moved the same way, start
  and elect a controller leader, and every nameserver serves.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mqmeta.cluster.layout import BrokerLayout
from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.ready import wait_brokers_ready, wait_ready
from mqmeta.cluster.supervisor import Supervisor

from mqmeta import cli
from mqmeta.config_file import accept_config_file, apply_config_file
from mqmeta.formats.replication_rules import load_config

pytestmark = [pytest.mark.timeout(60)]
MQMETA = [sys.executable, "-m", "mqmeta.cli"]
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
ADDRESS = re.compile(r"\b\d+\.\d+\.\d+\.\d+:\d+\b")
STARTED_TIMEOUT_S = 25.0


def parsed(*argv: str):
    return apply_config_file(cli.build_parser().parse_args(list(argv)))


def refused(capsys, *argv: str) -> str:
    """What `mqmeta ARGV` says when it refuses: exit 2, one line on stderr."""
    assert cli.main(list(argv)) == cli.EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.startswith("mqmeta: error: ") and error.count("\n") == 1, error
    return error


def node_flags(tmp_path: Path) -> list[str]:
    """A controller's flags, complete: only the file's refusal can keep it from starting."""
    return ["--id", "c1", "--grpc", "127.0.0.1:1", "--raft", "127.0.0.1:2", "--data-dir", str(tmp_path)]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- merging ---------------------------------------------------------------------------


def test_flags_override_the_file_and_defaults_fill_the_rest(tmp_path):
    broker = write(
        tmp_path / "broker.toml",
        'broker_name = "from-file"\nlisten = "127.0.0.1:1"\ncontrollers = "127.0.0.1:2"\n'
        'data_dir = "d"\nsegment_bytes = 4096\nno_all_ack = true\n',
    )
    args = parsed("broker", "--config", str(broker), "--listen", "127.0.0.1:9", "--segment-bytes", "8192")
    assert (args.broker_name, args.listen, args.segment_bytes) == ("from-file", "127.0.0.1:9", 8192)
    assert args.data_dir == Path("d") and args.no_all_ack is True  # converted like the flag
    assert args.send_timeout_ms == 3000 and args.cluster == "DefaultCluster"  # defaults
    assert parsed("broker", "--config", str(broker), "--no-all-ack").no_all_ack is True

    node = write(
        tmp_path / "c1.toml",
        'node_id = "c1"\npeer = ["c2=127.0.0.1:3/127.0.0.1:4"]\n[raft_settings]\nheartbeat_ms = 40\n',
    )
    args = parsed("controller", "--config", str(node))
    assert args.peer == ["c2=127.0.0.1:3/127.0.0.1:4"] and args.raft_settings == {"heartbeat_ms": 40}
    args = parsed("controller", "--config", str(node), "--peer", "c3=127.0.0.1:5/127.0.0.1:6", "--id", "c9")
    assert args.peer == ["c3=127.0.0.1:5/127.0.0.1:6"] and args.node_id == "c9"
    assert parsed("controller", "--id", "c1").peer == []  # no file: argparse's defaults

    rules = write(tmp_path / "r.toml", '[replicator]\nworker_id = "file-worker"\n')
    assert parsed("replicator", "--config", str(rules)).worker_id == "file-worker"
    assert parsed("replicator", "--config", str(rules), "--worker-id", "w7").worker_id == "w7"


def test_a_flag_added_after_accept_config_file_is_a_bug_caught_at_once(tmp_path):
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen")
    accept_config_file(parser)
    parser.add_argument("--tls-cert")  # too late: the file could never set it
    with pytest.raises(AssertionError, match="tls_cert"):
        apply_config_file(parser.parse_args(["--listen", "127.0.0.1:1"]))


def test_required_flags_may_come_from_either(tmp_path, capsys):
    error = refused(capsys, "broker", "--listen", "127.0.0.1:1")
    assert "--broker-name, --controllers, --data-dir" in error
    error = refused(capsys, "namesrv", "--controllers", "127.0.0.1:1")
    assert "--listen" in error


# --- refusals --------------------------------------------------------------------------


def test_unknown_keys_are_refused_by_name(tmp_path, capsys):
    broker = write(tmp_path / "broker.toml", 'listne = "127.0.0.1:1"\n')
    error = refused(capsys, "broker", "--config", str(broker))
    assert f"unknown key 'listne' in {broker}" in error and "did you mean 'listen'" in error
    assert "known keys: anonymous_reads, auth_file, broker_name, cluster, controllers" in error
    node = write(tmp_path / "c1.toml", 'node_id = "c1"\nconfig = "x.toml"\n')
    assert "unknown key 'config'" in refused(capsys, "controller", "--config", str(node))
    raft = write(tmp_path / "raft.toml", "[raft_settings]\nheartbeat = 50\n")
    error = refused(capsys, "controller", "--config", str(raft), *node_flags(tmp_path))
    assert "unknown key 'heartbeat' in [raft_settings]" in error
    secret = write(tmp_path / "secret.toml", "[raft_settings]\nsecret = 'hunter2'\n")
    error = refused(capsys, "controller", "--config", str(secret), *node_flags(tmp_path))
    assert "unknown key 'secret'" in error and "hunter2" not in error
    namesrv = write(tmp_path / "n.toml", 'listen = "127.0.0.1:1"\n[namesrv]\ncontrollers = "x"\n')
    assert "unknown key 'namesrv'" in refused(capsys, "namesrv", "--config", str(namesrv))
    rules = write(tmp_path / "r.toml", "[replicator]\nworkerid = 'w'\n[[rules]]\nname = 'r'\n")
    assert "unknown key 'workerid'" in refused(capsys, "replicator", "--config", str(rules))


@pytest.mark.parametrize(
    ("command", "text", "says"),
    [
        ("broker", 'segment_bytes = "64MB"\n', "'segment_bytes' in {} must be a whole number, not a string"),
        ("broker", "segment_bytes = true\n", "'segment_bytes' in {} must be a whole number, not a boolean"),
        ("broker", 'no_all_ack = "yes"\n', "'no_all_ack' in {} must be true or false, not a string"),
        ("broker", "listen = 9800\n", "'listen' in {} must be a string in quotes, not a number"),
        ("controller", 'peer = "c2=a:1/b:2"\n', "'peer' in {} must be a list"),
        ("controller", "peer = [1]\n", "'peer' in {} must be a string in quotes, not a number"),
        ("controller", "raft_settings = 3\n", "'raft_settings' in {} must be a table"),
        ("controller", "[raft_settings]\nheartbeat_ms = '50'\n", "'heartbeat_ms' in [raft_settings] must be"),
        ("controller", "[raft_settings]\njournal_fsync = 1\n", "'journal_fsync' in [raft_settings] must be"),
        ("replicator", "[replicator]\nworker_id = 3\n", "'worker_id' in {} must be a string in quotes"),
    ],
)
def test_a_key_of_the_wrong_type_is_refused_by_name(tmp_path, capsys, command, text, says):
    path = write(tmp_path / f"{command}.toml", text)
    extra = node_flags(tmp_path) if command == "controller" else []
    assert says.format(path) in refused(capsys, command, "--config", str(path), *extra)


def test_bad_files_are_refused_with_the_line_and_never_show_a_value(tmp_path, capsys):
    bad = write(tmp_path / "b.toml", 'cluster = "c"\n\nbroker_name = "hunter2\n')
    error = refused(capsys, "broker", "--config", str(bad))
    assert f"config file {bad} is not valid TOML at line 3" in error and "hunter2" not in error
    unterminated = write(tmp_path / "u.toml", 'cluster = "c"\npeer = [\n')
    assert "at line 2" in refused(capsys, "controller", "--config", str(unterminated))
    wrong = write(tmp_path / "w.toml", "[raft_settings]\nheartbeat_ms = 'hunter2'\n")
    assert "hunter2" not in refused(capsys, "controller", "--config", str(wrong), *node_flags(tmp_path))
    assert "does not exist" in refused(capsys, "broker", "--config", str(tmp_path / "nope.toml"))
    assert "cannot read config file" in refused(capsys, "namesrv", "--config", str(tmp_path))
    # The real entry point: exit status 2, one sentence, no traceback.
    done = subprocess.run(
        [*MQMETA, "broker", "--config", str(bad)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "line 3" in done.stderr


# --- the samples -----------------------------------------------------------------------

SAMPLE_COMMANDS = {"controller": "controller", "namesrv": "namesrv", "broker": "broker"}


def sample_command(path: Path) -> str:
    return next(command for prefix, command in SAMPLE_COMMANDS.items() if path.name.startswith(prefix))


def test_every_sample_file_loads_with_no_unknown_key():
    samples = sorted(DEPLOY.glob("*/*.toml"))
    assert len(samples) == 10, samples
    for path in samples:
        args = parsed(sample_command(path), "--config", str(path))
        document = tomllib.loads(path.read_text())
        flat = {k: v for k, v in document.items() if k != "raft_settings"}
        assert {key: getattr(args, key) for key in flat} == {
            key: Path(v) if key in ("data_dir", "secret_file") else v for key, v in flat.items()
        }, path
    replicator = parsed("replicator", "--config", str(DEPLOY / "replicator.toml"))
    assert replicator.metrics_listen == "10.0.0.21:9100"
    assert [rule.name for rule in load_config(DEPLOY / "replicator.toml").rules] == ["orders-dr"]


# --- the standalone sample deployment, started -----------------------------------------


def rewrite(text: str, moved: dict[str, str], directory: Path, secret: Path) -> str:
    """A sample with its addresses on loopback and its directory and secret in tmp_path."""
    text = ADDRESS.sub(lambda found: moved[found.group(0)], text)
    text = re.sub(r'^data_dir = ".*"', f'data_dir = "{directory}"', text, flags=re.M)
    return text.replace('"/etc/mqmeta/secret"', json.dumps(str(secret)))


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.cluster
def test_the_standalone_samples_start_elect_and_take_a_send(tmp_path):
    samples = sorted((DEPLOY / "standalone").glob("*.toml"))
    addresses = sorted({a for path in samples for a in ADDRESS.findall(path.read_text())})
    secret = write(tmp_path / "secret", "sample-deployment-secret\n")
    secret.chmod(0o600)
    with PortReservation.pick(len(addresses) + 1) as ports:
        moved = dict(zip(addresses, ports.addresses[:-1], strict=True))
        override = ports.addresses[-1]  # broker-a-2 is told to listen here by a flag
        supervisor = Supervisor(tmp_path)
        try:
            configs = {}
            for path in samples:
                configs[path.stem] = write(
                    tmp_path / path.name, rewrite(path.read_text(), moved, tmp_path / path.stem, secret)
                )
            for name in (
                "controller-c1",
                "controller-c2",
                "controller-c3",
                "namesrv",
                "broker-a-0",
                "broker-a-1",
            ):
                supervisor.start(name, [*MQMETA, sample_command(Path(name)), "--config", str(configs[name])])
            supervisor.start(
                "broker-a-2",
                [*MQMETA, "broker", "--config", str(configs["broker-a-2"]), "--listen", override],
            )
            file_values = {name: tomllib.loads(path.read_text()) for name, path in configs.items()}
            controllers = file_values["namesrv"]["controllers"]
            namesrv = file_values["namesrv"]["listen"]
            wait_ready(controllers, [namesrv], timeout_s=STARTED_TIMEOUT_S)
            brokers = [
                BrokerLayout(
                    name, "broker-a", override if name == "broker-a-2" else file_values[name]["listen"], ""
                )
                for name in ("broker-a-0", "broker-a-1", "broker-a-2")
            ]
            wait_brokers_ready(brokers, timeout_s=STARTED_TIMEOUT_S)
            assert not serving(file_values["broker-a-2"]["listen"])  # the flag won over the file
            assert supervisor.dead() == []
            created = subprocess.run(
                [
                    *MQMETA,
                    "admin",
                    "--controllers",
                    controllers,
                    "topic",
                    "create",
                    "Samples",
                    "--queues",
                    "2",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert created.returncode == 0, created.stderr
            sent = subprocess.run(
                [*MQMETA, "produce", "--namesrv", namesrv, "--topic", "Samples", "--count", "3", "--json"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert sent.returncode == 0, sent.stderr
            assert json.loads(sent.stdout)["acked"] == 3
        finally:
            supervisor.stop_all()


@pytest.mark.cluster
def test_the_embedded_samples_start_and_elect(tmp_path):
    samples = sorted((DEPLOY / "embedded").glob("*.toml"))
    addresses = sorted({a for path in samples for a in ADDRESS.findall(path.read_text())})
    secret = write(tmp_path / "secret", "sample-deployment-secret\n")
    with PortReservation.pick(len(addresses)) as ports:
        moved = dict(zip(addresses, ports.addresses, strict=True))
        supervisor = Supervisor(tmp_path)
        try:
            listens, controllers = [], []
            for path in samples:
                config = write(
                    tmp_path / path.name, rewrite(path.read_text(), moved, tmp_path / path.stem, secret)
                )
                values = tomllib.loads(config.read_text())
                listens.append(values["listen"])
                controllers.append(values["grpc"])
                supervisor.start(path.stem, [*MQMETA, "namesrv", "--config", str(config)])
            wait_ready(",".join(controllers), listens, timeout_s=STARTED_TIMEOUT_S)
            assert supervisor.dead() == []
        finally:
            supervisor.stop_all()
