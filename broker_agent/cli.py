"""`mqmeta broker`: its flags, and the broker process made of them (BrokerService, the
RocketMQ 5 service, the remoting port, metrics) until a signal stops it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from mqmeta.broker_agent.admin import BrokerAdmin
from mqmeta.broker_agent.agent import (
    DELAY_LEVELS_DEFAULT,
    DELAY_LEVELS_MAX,
    EXIT_DISK_FAILED,
    BrokerAgent,
    BrokerConfig,
    parse_delay_levels,
)
from mqmeta.broker_agent.commitlog import SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN
from mqmeta.broker_agent.metrics import BrokerMetrics
from mqmeta.broker_agent.service import BROKER_DESCRIPTOR, BROKER_SERVICE, BrokerServicer
from mqmeta.broker_agent.tiered import UPLOAD_BYTES_MAX

from mqmeta import call_stream, frames
from mqmeta.call_stream import ThreadedCallServer
from mqmeta.config_file import accept_config_file
from mqmeta.errors import InvalidArgument
from mqmeta.pb import broker_pb2_grpc as bpb_grpc
from mqmeta.pb import call_stream_pb2_grpc
from mqmeta.remoting.server import listen_address
from mqmeta.rpc import (
    STOP_GRACE_S,
    STOP_NOW_GRACE_S,
    add_health_and_reflection,
    build_server,
    run_stop_steps,
    serve_until_signal,
)
from mqmeta.validate import FlagNumber, parse_addresses, validate_name

# The ranges of the broker's numeric flags (and --config keys), checked at parse time: a
# value outside would start a broker that loops on a refused registration (priority), fails a
# protobuf field, or overflows a timer at its first send.
PRIORITY_MAX = 1_000_000  # the controller's bound on election_priority
REPLICAS_MAX = 16
TIMEOUT_MS_MIN, TIMEOUT_MS_MAX = 100, 3_600_000
RETENTION_BYTES_MAX = 1 << 50  # 1 PiB
UPLOAD_BYTES_MIN = 1 << 10  # as TieredConfig.validate checks them when --tiered-store is given
UPLOAD_INTERVAL_MS_MIN, UPLOAD_INTERVAL_MS_MAX = 10, 3_600_000
PORT_MAX = 65535


def _bounded(flag: str, minimum: int, maximum: int) -> FlagNumber:
    return FlagNumber(flag, int, minimum, maximum)


def add_parser(subparsers: Any) -> None:
    broker = subparsers.add_parser("broker", help="run one broker agent")
    broker.add_argument("--cluster", default="DefaultCluster")
    broker.add_argument("--broker-name", required=True)
    broker.add_argument("--listen", required=True, help="gRPC address HOST:PORT")
    broker.add_argument("--controllers", required=True, help="HOST:PORT[,HOST:PORT...]")
    broker.add_argument("--data-dir", type=Path, required=True)
    broker.add_argument(
        "--election-priority", type=_bounded("--election-priority", 0, PRIORITY_MAX), default=0
    )
    broker.add_argument("--in-sync-replicas", type=_bounded("--in-sync-replicas", 1, REPLICAS_MAX), default=1)
    broker.add_argument(
        "--min-in-sync-replicas", type=_bounded("--min-in-sync-replicas", 1, REPLICAS_MAX), default=1
    )
    broker.add_argument(
        "--no-all-ack",
        action="store_true",
        help="acknowledge at in_sync_replicas copies instead of the whole set",
    )
    broker.add_argument(
        "--ha-max-time-slave-not-catchup-ms",
        type=_bounded("--ha-max-time-slave-not-catchup-ms", TIMEOUT_MS_MIN, TIMEOUT_MS_MAX),
        default=15_000,
    )
    broker.add_argument(
        "--send-timeout-ms", type=_bounded("--send-timeout-ms", TIMEOUT_MS_MIN, TIMEOUT_MS_MAX), default=3000
    )
    broker.add_argument(
        "--no-ha-stream",
        action="store_true",
        help="as master, offer no HA stream; as slave, fetch over gRPC HaFetch calls only "
        "(the stream is used only without TLS and auth in any case)",
    )
    broker.add_argument(
        "--ha-stream-port",
        type=_bounded("--ha-stream-port", 0, PORT_MAX),
        default=0,
        help="as master, serve the HA stream on this port of the --listen host (open it in "
        "firewalls between brokers; a taken port stops the start); 0: one the kernel picks",
    )
    broker.add_argument(
        "--no-call-stream",
        action="store_true",
        help="offer our clients no call stream: their sends and other unary calls stay gRPC "
        "calls (the stream is offered only without TLS and auth in any case)",
    )
    broker.add_argument(
        "--segment-bytes",
        type=_bounded("--segment-bytes", SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX),
        default=64 << 20,
    )
    broker.add_argument(
        "--metrics-listen", default="", help="serve Prometheus metrics over HTTP on HOST:PORT"
    )
    broker.add_argument(
        "--remoting-listen",
        default="",
        help="serve RocketMQ 4.x clients (the classic remoting protocol) on HOST:PORT",
    )
    broker.add_argument(
        "--tiered-store", default="", help="tiered storage location: a directory or an fsspec URL"
    )
    broker.add_argument(
        "--tiered-upload-bytes",
        type=_bounded("--tiered-upload-bytes", UPLOAD_BYTES_MIN, UPLOAD_BYTES_MAX),
        default=4 << 20,
    )
    broker.add_argument(
        "--tiered-upload-interval-ms",
        type=_bounded("--tiered-upload-interval-ms", UPLOAD_INTERVAL_MS_MIN, UPLOAD_INTERVAL_MS_MAX),
        default=2000,
    )
    broker.add_argument(
        "--local-retention-bytes",
        type=_bounded("--local-retention-bytes", 0, RETENTION_BYTES_MAX),
        default=0,
        help="keep at least this many bytes locally once uploaded (0 = keep all)",
    )
    broker.add_argument(
        "--message-delay-levels",
        type=_DelayLevels(),
        default=DELAY_LEVELS_DEFAULT,
        help="RocketMQ's messageDelayLevel: the delay of each level, level 1 first, "
        "as a number and a unit (ms, s, m, h, d); a 4.x consumer's retries wait level 3 and up",
    )
    accept_config_file(broker)  # last: every flag above is a key of the file


class _DelayLevels:
    """The argparse type of --message-delay-levels (its `allowed` names the values for the
    reference pages)."""

    __name__ = "delay levels"
    allowed = f"1 to {DELAY_LEVELS_MAX} levels, each a whole number and a unit (ms, s, m, h or d), at most 7d"

    def __call__(self, text: str) -> tuple[int, ...]:
        try:
            return parse_delay_levels(text)
        except InvalidArgument as error:  # argparse puts "argument --message-delay-levels: " in front
            raise argparse.ArgumentTypeError(error.message) from None


def run(args: argparse.Namespace) -> int:
    """`mqmeta broker`: a broker from the flags, served until a signal stops it."""
    config = _broker_config(args)
    if args.metrics_listen:
        parse_addresses(args.metrics_listen, "--metrics-listen address")
    serve_until_signal(_start(config, args.metrics_listen))
    return 0


def _broker_config(args: argparse.Namespace) -> BrokerConfig:
    """The broker's configuration from the flags, every relation between them checked."""
    validate_name("--cluster", args.cluster)
    validate_name("--broker-name", args.broker_name)
    config = BrokerConfig(
        cluster=args.cluster,
        broker_name=args.broker_name,
        listen=parse_addresses(args.listen, "--listen address")[0],
        controllers=parse_addresses(args.controllers),
        data_dir=args.data_dir,
        election_priority=args.election_priority,
        in_sync_replicas=args.in_sync_replicas,
        min_in_sync_replicas=args.min_in_sync_replicas,
        all_ack_in_sync_state_set=not args.no_all_ack,
        ha_max_time_slave_not_catchup_ms=args.ha_max_time_slave_not_catchup_ms,
        send_timeout_ms=args.send_timeout_ms,
        ha_stream=not args.no_ha_stream,
        ha_stream_port=args.ha_stream_port,
        call_stream=not args.no_call_stream,
        segment_bytes=args.segment_bytes,
        tiered_url=args.tiered_store,
        tiered_upload_bytes=args.tiered_upload_bytes,
        tiered_upload_interval_ms=args.tiered_upload_interval_ms,
        local_retention_bytes=args.local_retention_bytes,
        message_delay_levels_ms=args.message_delay_levels,
    )
    if listen_address(args):
        config.extra["remoting"] = listen_address(args)
    if config.tiered_url:
        from mqmeta.broker_agent.tiered import TieredConfig

        TieredConfig(
            config.tiered_url,
            config.tiered_upload_bytes,
            config.tiered_upload_interval_ms,
            config.local_retention_bytes,
        ).validate()
    elif config.local_retention_bytes:
        raise InvalidArgument(
            "--local-retention-bytes needs --tiered-store: local segments are "
            "deleted only once they are in the tiered store"
        )
    return config


def _start(config: BrokerConfig, metrics_listen: str) -> Any:
    """Starts the broker's servers and agent; returns what stops them (graceful or at once)."""
    # The RocketMQ 5 service (and its stubs, which clash with the official client's in one
    # process) is imported only here, in the broker process.
    from mqmeta.broker_agent.rmq_service import (
        REQUEST_BYTES_MAX,
        SERVER_WORKERS,
        MessagingServicer,
        RmqBroker,
    )

    from mqmeta.pb.apache.rocketmq.v2 import service_pb2_grpc as rsvc_grpc
    from mqmeta.rocketmq import MESSAGING_SERVICE

    try:
        agent = BrokerAgent(config)
    except OSError as error:  # the disk failed (EIO, ENOSPC, ...): a restart may find it back
        print(f"mqmeta: error: cannot open the store in {config.data_dir}: {error}", file=sys.stderr)
        return EXIT_DISK_FAILED
    metrics = BrokerMetrics(agent)
    rmq = RmqBroker(agent, metrics.rocketmq_send_writes.inc)
    server = build_server(config.listen, SERVER_WORKERS, REQUEST_BYTES_MAX)
    admin = BrokerAdmin(
        agent,
        member_sources=[rmq.members.of_group],
        ensure_topic=rmq.metadata.ensure_dead_letter_topic,
        forget_cursors=rmq.pop.forget,
    )
    servicer = BrokerServicer(agent, metrics, admin)
    bpb_grpc.add_BrokerServiceServicer_to_server(servicer, server)
    rsvc_grpc.add_MessagingServiceServicer_to_server(MessagingServicer(rmq, metrics), server)
    add_health_and_reflection(server, [BROKER_SERVICE, MESSAGING_SERVICE, call_stream.SERVICE])
    agent.bind_stream_server()  # a taken --ha-stream-port ends the start before gRPC serves
    calls = _call_stream(config, servicer, metrics, server)  # bound before gRPC serves
    server.start()
    agent.start()
    rmq.start()
    remoting = None
    if config.extra.get("remoting"):
        from mqmeta.broker_agent.remoting import start_remoting

        remoting, remoting_groups = start_remoting(agent, rmq, config.extra["remoting"])
        admin.member_sources.append(remoting_groups.of_group)
    metrics.serve(metrics_listen)

    class _Node:
        def stop(self, graceful: bool = True) -> None:
            # SIGTERM: hand off (a master) or leave the SyncStateSet (a slave) while the
            # server still answers the slaves' fetches, then stop serving. SIGINT (Ctrl-C,
            # `local up` stopping the whole cluster): the slaves are stopping too, so a
            # handoff could only wait for them; the controllers' failover takes over.
            grace = STOP_GRACE_S if graceful else STOP_NOW_GRACE_S

            def stop_serving() -> None:
                # Both stop accepting at once; the calls being served on either get the
                # grace (a Send whose answer is lost is sent again: a duplicate message).
                stopped = server.stop(grace=grace)
                if calls is not None:
                    calls.stop(grace)
                stopped.wait()

            steps: list[Callable[[], object]] = [agent.depart] if graceful else []
            steps.append(stop_serving)
            if remoting is not None:
                steps.append(remoting.stop)
            run_stop_steps([*steps, rmq.stop, agent.stop, metrics.stop])

    return _Node()


def _call_stream(
    config: BrokerConfig, servicer: BrokerServicer, metrics: BrokerMetrics, server: grpc.Server
) -> ThreadedCallServer | None:
    """The call stream (mqmeta/call_stream.py), started; CallStream.Offer tells clients its
    port (0: none, under TLS or auth or with --no-call-stream)."""
    stream = None
    if config.call_stream and frames.offered():
        table = call_stream.handlers(servicer, BROKER_DESCRIPTOR)
        host = frames.host_of(config.listen)
        stream = ThreadedCallServer(host, config.listen, table, metrics.call_stream_calls.inc)
        stream.start()
    port = stream.port if stream is not None else 0
    offer = call_stream.OfferServicer(lambda: port, [BROKER_SERVICE] if port else [], config.listen)
    call_stream_pb2_grpc.add_CallStreamServicer_to_server(offer, server)
    return stream
