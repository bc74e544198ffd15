"""`mqmeta admin ... message query|trace|resend` and `group lag|reset-offsets`: the
brokers' admin calls (BrokerService, broker_agent/admin.py), fanned out over the broker
sets the controllers list, to each set's master.

Every handler returns (json document, table rows), like the other admin commands; a
broker's refusal is one sentence (exit 2), naming the broker set.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable
from typing import Any

from mqmeta import tls
from mqmeta.client import ControllerClient
from mqmeta.errors import InvalidArgument, MqmetaError, NotFound
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb_json import message_to_json as _dict

Json = dict[str, Any]
TIME_MS_MAX = 1 << 62


class _TimeMs:
    """An argparse type: milliseconds since the epoch, or an ISO 8601 time (UTC unless
    it names its offset), e.g. 2026-11-28T01:00:00Z."""

    allowed = "milliseconds since the epoch, or an ISO 8601 time (UTC unless it names its offset)"
    __name__ = "time"

    def __call__(self, text: str) -> int:
        if text.isdigit():
            value = int(text)
            if value > TIME_MS_MAX:
                raise argparse.ArgumentTypeError(f"{text[:64]} is past the year 146 million")
            return value
        try:
            moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text[:64]!r} is neither milliseconds since the epoch nor an ISO 8601 time"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.UTC)
        value = int(moment.timestamp() * 1000)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text[:64]} is before 1970")
        return value


time_ms = _TimeMs()


def add_message_commands(sub, leaf: Callable, int_in: Callable[[int, int], Callable[[str], int]]) -> None:
    """`message` and its subcommands; `leaf` is admin_cli's (adds --json and the handler)."""
    queue_id, offset = int_in(0, 65535), int_in(0, 2**62)
    message = sub.add_parser("message", help="query, trace and resend messages")
    message_sub = message.add_subparsers(dest="message_command", required=True, parser_class=type(message))

    query = leaf(message_sub, "query", "messages by id, key, queue offset or store-time range", message_query)
    query.add_argument("--topic", default="", help="needed for --key, --queue/--offset, --since/--until")
    query.add_argument("--id", default="", help="a message id (ours, a RocketMQ client's, a copy's)")
    query.add_argument("--key", default="", help="a key (messages carry space-separated keys)")
    query.add_argument("--queue", type=queue_id, default=None, help="queue id (with --offset)")
    query.add_argument("--offset", type=offset, default=None, help="queue offset (with --queue)")
    query.add_argument(
        "--since", type=time_ms, default=None, help="store time: ms since the epoch or ISO 8601"
    )
    query.add_argument("--until", type=time_ms, default=None, help="store time, exclusive")
    query.add_argument("--broker-name", default="", help="one broker set only")
    query.add_argument("--max", type=int_in(1, 64), default=32, help="messages per broker set")
    query.add_argument("--body-bytes", type=int_in(1, 1 << 20), default=4096, help="bodies are cut past this")

    for name, handler, text in (
        ("trace", message_trace, "where one message is: replicas, tiered, groups, retries, DLQ"),
        ("resend", message_resend, "a copy for one group (%RETRY%GROUP); from its DLQ: the requeue"),
    ):
        p = leaf(message_sub, name, text, handler)
        p.add_argument("--id", default="", help="the message id")
        p.add_argument("--topic", default="", help="with --queue/--offset (or to narrow --id)")
        p.add_argument("--broker-name", default="", help="with --queue/--offset: the broker set")
        p.add_argument("--queue", type=queue_id, default=None, help="queue id (with --offset)")
        p.add_argument("--offset", type=offset, default=None, help="queue offset (with --queue)")
        if name == "resend":
            p.add_argument("--group", required=True, help="the group that consumes the copy")
        else:
            p.add_argument(
                "--replicator-controllers",
                default="",
                help="the target cluster's controllers, whose replicator tasks may have copied it",
            )


def add_group_commands(group_sub, leaf: Callable) -> None:
    lag = leaf(group_sub, "lag", "a group's backlog per queue, and its members", group_lag)
    lag.add_argument("name", help="the consumer group")
    lag.add_argument("--topic", default="", help="every queue of this topic (default: those with progress)")
    reset = leaf(
        group_sub, "reset-offsets", "move a group's offsets to a time, the earliest or latest", reset_offsets
    )
    reset.add_argument("name", help="the consumer group")
    reset.add_argument("--topic", default="", help="this topic only (default: every queue with progress)")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-time", type=time_ms, default=None, help="ms since the epoch or ISO 8601")
    to.add_argument("--earliest", action="store_true", help="the oldest offset still stored")
    to.add_argument("--latest", action="store_true", help="the readable end (skip the backlog)")
    reset.add_argument("--force", action="store_true", help="even while members are connected")


# Calls ------------------------------------------------------------------------------------


def _masters(client: ControllerClient, broker_name: str = "") -> list[tuple[str, str]]:
    """(broker name, master address) of every broker set with a master."""
    sets = client.list_broker_sets(pb.ListBrokerSetsRequest()).broker_sets
    found = [(s.broker_name, s.master_address) for s in sets if s.master_address]
    if broker_name:
        found = [f for f in found if f[0] == broker_name]
        if not found:
            raise NotFound(f"broker set {broker_name} is not registered or has no master")
    if not found:
        raise NotFound("no broker set has a master to ask")
    return found


def _call(address: str, broker_name: str, method: str, request: Any, timeout_s: float) -> Any:
    """One BrokerService call; a refusal becomes the broker's sentence, naming the set."""
    import grpc

    from mqmeta.pb import broker_pb2_grpc
    from mqmeta.rpc import from_rpc_error

    with tls.channel(address) as channel:
        try:
            return getattr(broker_pb2_grpc.BrokerServiceStub(channel), method)(request, timeout=timeout_s)
        except grpc.RpcError as error:
            found = from_rpc_error(error)
            found.message = f"broker set {broker_name} ({address}): {found.message}"
            raise found from None


def _fan_out(client, args, method: str, request: Any) -> tuple[list[Any], list[MqmetaError]]:
    """The call on every master (or args.broker_name's); NOT_FOUND answers are collected."""
    answers: list[Any] = []
    missing: list[MqmetaError] = []
    for name, address in _masters(client, getattr(args, "broker_name", "")):
        try:
            answers.append(_call(address, name, method, request, args.timeout))
        except NotFound as error:
            missing.append(error)
    return answers, missing


def _message_json(queried: Any) -> Json:
    document = _dict(queried)
    message = document.pop("message", {})
    return {**message, **document}


def _position(args, broker_pb2) -> Any:
    if (args.queue is None) != (args.offset is None):
        raise InvalidArgument("--queue and --offset go together")
    if args.queue is None:
        return None
    if not args.topic:
        raise InvalidArgument("--queue/--offset need --topic")
    return broker_pb2.QueuePosition(queue_id=args.queue, queue_offset=args.offset)


def _query_request(args, broker_pb2) -> Any:
    position = _position(args, broker_pb2)
    chosen = [
        name
        for name, given in (
            ("--id", bool(args.id)),
            ("--key", bool(args.key)),
            ("--queue/--offset", position is not None),
            ("--since/--until", args.since is not None or args.until is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        raise InvalidArgument("name exactly one of --id, --key, --queue/--offset, --since/--until")
    request = broker_pb2.QueryMessagesRequest(
        topic=args.topic, max_count=args.max, body_bytes_max=args.body_bytes
    )
    if args.id:
        request.msg_id = args.id
    elif args.key:
        request.key = args.key
    elif position is not None:
        request.position.CopyFrom(position)
    else:
        since, until = args.since or 0, args.until or 0
        if until and until <= since:
            raise InvalidArgument(f"--until ({until}) must be after --since ({since})")
        request.time_range.CopyFrom(broker_pb2.TimeRange(since_ms=since, until_ms=until))
    if not args.id and not args.topic:
        raise InvalidArgument(f"{chosen[0]} needs --topic")
    return request


def message_query(client: ControllerClient, args):
    from mqmeta.pb import broker_pb2

    request = _query_request(args, broker_pb2)
    answers, missing = _fan_out(client, args, "QueryMessages", request)
    if (args.id or request.HasField("position")) and not answers:
        raise NotFound(missing[0].message if len(missing) == 1 else "no broker set holds that message")
    messages = [_message_json(m) for answer in answers for m in answer.messages]
    messages.sort(
        key=lambda m: (-m["store_timestamp_ms"], m["broker_name"], m["queue_id"], m["queue_offset"])
    )
    rows = [
        {
            "broker": m["broker_name"],
            "queue": m["queue_id"],
            "offset": m["queue_offset"],
            "msg_id": m["msg_id"],
            "stored": _time_text(m["store_timestamp_ms"]),
            "tags": m["tags"],
            "keys": m["keys"],
            "bytes": m["body_bytes"],
        }
        for m in messages
    ]
    return {"messages": messages}, rows


def _time_text(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")


def _one(client, args, method: str, request: Any) -> Any:
    """The answer of the one broker set holding the message (NOT_FOUND when none does)."""
    answers, missing = _fan_out(client, args, method, request)
    if not answers:
        raise NotFound(missing[0].message if len(missing) == 1 else "no broker set holds that message")
    return answers[0]


def _named(args, broker_pb2, request: Any) -> Any:
    position = _position(args, broker_pb2)
    if bool(args.id) == (position is not None):
        raise InvalidArgument("name the message by --id, or by --topic, --queue and --offset")
    if position is not None:
        if not args.broker_name:
            raise InvalidArgument("--queue/--offset need --broker-name (queues are per broker set)")
        request.position.CopyFrom(position)
        request.topic = args.topic
    else:
        request.msg_id = args.id
        request.topic = args.topic
    return request


def message_trace(client: ControllerClient, args):
    from mqmeta.pb import broker_pb2

    trace = _one(client, args, "TraceMessage", _named(args, broker_pb2, broker_pb2.TraceMessageRequest()))
    document = _dict(trace)
    document["message"] = _message_json(trace.message)
    document["replicated_to"] = _replicated_to(args, trace)
    message = document["message"]
    summary = {
        "msg_id": message["msg_id"],
        "where": f"{message['broker_name']} "
        f"{message['topic']}/{message['queue_id']}/{message['queue_offset']}",
        "confirmed": message["confirmed"],
        "replicas": ", ".join(
            f"{r['broker_id']}: {'holds' if r['holds'] else 'not yet'}" for r in document["replicas"]
        ),
        "tiered": document["tiered"],
        "groups past it": ", ".join(g["group"] for g in document["groups"] if g["consumed"]),
        "retries": ", ".join(f"{r['topic']}/{r['queue_offset']}" for r in document["retries"]),
        "replicated to": ", ".join(
            f"{r['rule']} (acked {r['acked_offset']})" for r in document["replicated_to"]
        ),
    }
    return document, [{"field": k, "value": v} for k, v in summary.items()]


def _replicated_to(args, trace: Any) -> list[Json]:
    """The replicator tasks (in the target cluster's controllers, or these ones) whose
    source queue holds the message and whose acknowledged offset is past it."""
    message = trace.message.message
    addresses = args.replicator_controllers or args.controllers
    with ControllerClient(addresses, timeout_s=args.timeout) as target:
        status = target.get_replicator_status(pb.GetReplicatorStatusRequest())
    copied = []
    for rule in status.rules:
        for task in rule.tasks:
            if (task.task.topic, task.task.broker_name, task.task.queue_id) == (
                message.topic,
                trace.message.broker_name,
                message.queue_id,
            ) and task.acked_offset > message.queue_offset:
                copied.append(
                    {"rule": rule.name, "worker": task.worker_id, "acked_offset": task.acked_offset}
                )
    return copied


def message_resend(client: ControllerClient, args):
    from mqmeta.pb import broker_pb2

    request = _named(args, broker_pb2, broker_pb2.ResendMessageRequest(group=args.group))
    answer = _one(client, args, "ResendMessage", request)
    document = _dict(answer.result)
    return document, document


def _lag_rows(answers: list[Any]) -> tuple[list[Json], list[Json], list[Json]]:
    queues, members, rows = [], [], []
    for answer in answers:
        for queue in answer.queues:
            document = {"broker_name": answer.broker_name, **_dict(queue)}
            queues.append(document)
            rows.append(
                {
                    "broker": answer.broker_name,
                    "topic": queue.topic,
                    "queue": queue.queue_id,
                    "consumed": queue.consumed_offset,
                    "max": queue.max_offset,
                    "backlog": queue.backlog,
                    "backlog_s": round(queue.backlog_ms / 1000, 1),
                }
            )
        members += [{"broker_name": answer.broker_name, **_dict(m)} for m in getattr(answer, "members", [])]
    return queues, members, rows


def group_lag(client: ControllerClient, args):
    from mqmeta.pb import broker_pb2

    request = broker_pb2.GroupLagRequest(group=args.name, topic=args.topic)
    answers = [
        _call(address, name, "GetGroupLag", request, args.timeout) for name, address in _masters(client)
    ]
    queues, members, rows = _lag_rows(answers)
    document = {
        "group": args.name,
        "queues": queues,
        "members": members,
        "backlog": sum(q["backlog"] for q in queues),
        "backlog_ms": max((q["backlog_ms"] for q in queues), default=0),
    }
    return document, rows


def reset_offsets(client: ControllerClient, args):
    from mqmeta.pb import broker_pb2

    request = broker_pb2.ResetOffsetsRequest(group=args.name, topic=args.topic, force=args.force)
    if args.to_time is not None:
        request.timestamp_ms = args.to_time
    elif args.earliest:
        request.earliest = True
    else:
        request.latest = True
    answers, missing = _fan_out(client, args, "ResetOffsets", request)
    if not answers:
        raise NotFound(
            f"group {args.name} has no progress on any broker set"
            + (f" and topic {args.topic} has no queue" if args.topic else "")
        )
    queues, _, rows = _lag_rows(answers)
    return {"group": args.name, "queues": queues}, rows
