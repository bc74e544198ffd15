"""`mqmeta admin --controllers ADDRS COMMAND [--json]`: gRPC admin calls.

--json prints one JSON document on stdout; otherwise a readable table. Errors go to
stderr as one sentence with exit status 2 (see mqmeta.cli).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from mqmeta import admin_messages, tls
from mqmeta.client import ControllerClient
from mqmeta.context import CONTROLLERS, add_context_flags
from mqmeta.errors import FailedPrecondition, InvalidArgument
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb_json import message_to_json as _dict
from mqmeta.validate import QUEUE_COUNT_MAX, REQUEST_INT_MAX

# --timeout: a whole call's bound; past an hour (or inf, nan) a call to an unreachable
# controller would wait forever.
TIMEOUT_S_MAX = 3600.0
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

Json = dict[str, Any]


def _int_in(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number from minimum to maximum (a larger one would not fit
    the request's protobuf field and fail there with a traceback)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:64]!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{text[:64]} must be at most {maximum}")
        return value

    return parse


_count = _int_in(1, QUEUE_COUNT_MAX)
_broker_id = _int_in(1, REQUEST_INT_MAX)


def _timeout_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:64]!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= TIMEOUT_S_MAX:
        raise argparse.ArgumentTypeError(
            f"{text[:64]} is not more than 0 and at most {TIMEOUT_S_MAX:g} seconds"
        )
    return value


def _leaf(sub, name: str, help_text: str, handler: Callable) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=handler)
    return parser


def _broker_set_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", default="DefaultCluster")
    parser.add_argument("--broker-name", required=True)


def add_parser(subparsers: Any) -> None:
    """`mqmeta admin` and its commands."""
    admin = subparsers.add_parser("admin", help="gRPC admin calls")
    add_context_flags(admin, CONTROLLERS)
    admin.add_argument("--timeout", type=_timeout_s, default=5.0, help="seconds for the whole call")
    sub = admin.add_subparsers(dest="admin_command", required=True, parser_class=type(admin))

    _leaf(sub, "cluster-status", "controller nodes, leader, term, commit index", cluster_status)
    _leaf(sub, "broker-sets", "every registered broker set", broker_sets).add_argument(
        "--cluster", default=""
    )
    _broker_set_flags(_leaf(sub, "sync-state", "master, epochs and SyncStateSet", sync_state))
    elect = _leaf(sub, "elect-master", "elect a master (optionally a preferred broker)", elect_master)
    _broker_set_flags(elect)
    elect.add_argument("--broker-id", type=_broker_id, default=0, help="preferred broker id")
    handoff = _leaf(
        sub, "handoff", "hand the master role to an in-sync slave (no failed sends)", handoff_master
    )
    _broker_set_flags(handoff)
    handoff.add_argument("--broker-id", type=_broker_id, default=0, help="preferred successor's broker id")
    clean = _leaf(sub, "clean-broker", "remove broker ids (or a whole set) from metadata", clean_broker)
    _broker_set_flags(clean)
    clean.add_argument("--broker-id", type=_broker_id, action="append", default=[])
    clean.add_argument("--force", action="store_true", help="also clean brokers that are alive")

    _broker_set_flags(_leaf(sub, "ha-status", "each replica's role, offsets and slaves", ha_status))
    _broker_set_flags(_leaf(sub, "broker-epoch", "each replica's epoch cache", broker_epoch))
    _broker_set_flags(_leaf(sub, "tiered-status", "what the tiered store holds, and the lag", tiered_status))

    _leaf(
        sub, "replicator-status", "replication rules: tasks, their workers and progress", replicator_status
    ).add_argument("--rule", default="", help="one rule only")
    history = _leaf(
        sub, "history", "the commands the controller applied, newest first (fenced ones too)", history_page
    )
    history.add_argument(
        "--limit", type=_int_in(1, INT32_MAX), default=100, help="commands per page (at most 1000)"
    )
    history.add_argument(
        "--before",
        type=_int_in(1, INT64_MAX),
        default=0,
        help="entries below this Raft index (the next page)",
    )
    history.add_argument(
        "--type", action="append", default=[], dest="command_types", help="this command type only (repeat)"
    )
    _add_topic_commands(sub, type(admin))
    _add_group_commands(sub, type(admin))
    _add_config_commands(sub, type(admin))


def _add_topic_commands(sub: Any, parser_class: type) -> None:
    topic = sub.add_parser("topic", help="create, update, delete, list topics; show a route")
    topic_sub = topic.add_subparsers(dest="topic_command", required=True, parser_class=parser_class)
    for name, handler in (("create", topic_create), ("update", topic_update)):
        p = _leaf(topic_sub, name, f"{name} a topic", handler)
        p.add_argument("name")
        p.add_argument("--queues", type=_count, default=0, help="queues per broker set")
        p.add_argument("--cluster", default="")
        p.add_argument("--broker-name", action="append", default=[], dest="broker_names")
        p.add_argument("--perm", default="", choices=["", "RW", "R", "W"])
        p.add_argument("--message-type", default="", choices=["", "NORMAL", "FIFO", "DELAY", "TRANSACTION"])
        if name == "update":
            p.add_argument(
                "--if-queues",
                type=_count,
                default=0,
                help="update only while the topic has this many queues (compare-and-set)",
            )
    _leaf(topic_sub, "delete", "delete a topic", topic_delete).add_argument("name")
    _leaf(topic_sub, "list", "list topics", topic_list)
    _leaf(topic_sub, "route", "the route of a topic", topic_route).add_argument("name")


def _add_group_commands(sub: Any, parser_class: type) -> None:
    group = sub.add_parser("group", help="create, update, delete, list subscription groups")
    group_sub = group.add_subparsers(dest="group_command", required=True, parser_class=parser_class)
    for name, handler in (("create", group_create), ("update", group_update)):
        p = _leaf(group_sub, name, f"{name} a subscription group", handler)
        p.add_argument("name")
        p.add_argument(
            "--subscription", action="append", default=[], help="TOPIC or TOPIC:TAG_EXPRESSION (repeat)"
        )
        p.add_argument("--consume-from", default="", choices=["", "LAST_OFFSET", "FIRST_OFFSET", "TIMESTAMP"])
        p.add_argument("--consume-timestamp-ms", type=_int_in(-INT64_MAX - 1, INT64_MAX), default=0)
        p.add_argument("--retry-max-times", type=_int_in(-INT32_MAX - 1, INT32_MAX), default=0)
        p.add_argument("--retry-policy", default="", choices=["", "EXPONENTIAL", "FIXED"])
    _leaf(group_sub, "delete", "delete a group", group_delete).add_argument("name")
    _leaf(group_sub, "list", "list groups", group_list)
    admin_messages.add_group_commands(group_sub, _leaf)
    admin_messages.add_message_commands(sub, _leaf, _int_in)


def _add_config_commands(sub: Any, parser_class: type) -> None:
    config = sub.add_parser("config", help="read or change run-time controller configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True, parser_class=parser_class)
    _leaf(config_sub, "get", "show the configuration", config_get)
    _leaf(config_sub, "set", "change KEY=VALUE pairs", config_set).add_argument(
        "pairs", nargs="+", metavar="KEY=VALUE"
    )


@dataclass(frozen=True)
class _Report:
    """A text answer with fields above its table (the --json document's top-level fields)."""

    fields: Json
    rows: list[Json]
    by_column: bool = False  # one column per row (many fields, few rows: readable in 80 columns)


def run(args: argparse.Namespace) -> int:
    with ControllerClient(args.controllers, timeout_s=args.timeout) as client:
        document, rows = args.handler(client, args)
    if args.json:
        print(json.dumps(document, indent=2, sort_keys=True))
    elif isinstance(rows, _Report):
        console = Console()
        for key, value in rows.fields.items():
            console.print(f"{key}: {_cell(value)}", highlight=False)
        if rows.by_column:
            _print_columns(rows.rows)
        else:
            _print_rows(rows.rows)
    else:
        _print_rows(rows)
    return 0


def _print_rows(rows: list[Json] | Json) -> None:
    console = Console()
    if isinstance(rows, dict):
        rows = [rows]
    if not rows:
        console.print("(none)")
        return
    table = Table()
    for name in rows[0]:
        table.add_column(name, overflow="fold")  # a narrow terminal wraps a value, never cuts it
    for row in rows:
        table.add_row(*(_cell(v) for v in row.values()))
    console.print(table)


def _print_columns(rows: list[Json]) -> None:
    """The rows as columns: a first column of field names, then one column per row."""
    if not rows:
        Console().print("(none)")
        return
    names = list(dict.fromkeys(k for row in rows for k in row))
    table = Table(show_header=False)
    table.add_column(style="bold", no_wrap=True, min_width=max(len(name) for name in names))
    for _ in rows:
        table.add_column(overflow="fold")
    for name in names:
        table.add_row(name, *(_cell(row.get(name, "")) for row in rows))
    Console().print(table)


def _cell(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


# Handlers: (client, args) -> (json document, table rows) ------------------------------


def cluster_status(client: ControllerClient, args):
    meta = client.get_metadata(pb.GetMetadataRequest())
    nodes = [
        {"id": n.id, "grpc": n.grpc, "raft": n.raft, "role": n.role, "healthy": n.healthy} for n in meta.nodes
    ]
    document = {
        "leader": meta.leader_id,
        "leader_grpc": meta.leader_grpc,
        "term": meta.term,
        "commit_index": meta.commit_index,
        "last_applied": meta.last_applied,
        "answered_by": meta.node_id,
        "state_digest": meta.state_digest,
        "nodes": nodes,
    }
    return document, _Report({k: v for k, v in document.items() if k != "nodes"}, nodes)


def _replica_document(info: pb.ReplicaInfo) -> Json:
    return {
        "cluster": info.cluster,
        "broker_name": info.broker_name,
        "master_broker_id": info.master_broker_id,
        "master_address": info.master_address,
        "master_epoch": info.master_epoch,
        "sync_state_set": list(info.sync_state_set),
        "sync_state_set_epoch": info.sync_state_set_epoch,
        "replicas": [
            {
                "broker_id": r.broker_id,
                "address": r.address,
                "alive": r.alive,
                "election_priority": r.election_priority,
            }
            for r in info.replicas
        ],
    }


def _ref(args) -> pb.BrokerSetRef:
    return pb.BrokerSetRef(cluster=args.cluster, broker_name=args.broker_name)


def sync_state(client: ControllerClient, args):
    data = client.get_sync_state_data(_ref(args))
    document = _replica_document(data.replica_info)
    return document, document["replicas"]


def broker_sets(client: ControllerClient, args):
    reply = client.list_broker_sets(pb.ListBrokerSetsRequest(cluster=args.cluster))
    sets = [_replica_document(s) for s in reply.broker_sets]
    rows = [{k: v for k, v in s.items() if k != "replicas"} for s in sets]
    return {"broker_sets": sets}, rows


def elect_master(client: ControllerClient, args):
    info = client.elect_master(
        pb.ElectMasterRequest(
            cluster=args.cluster,
            broker_name=args.broker_name,
            trigger=pb.ELECT_TRIGGER_ADMIN,
            preferred_broker_id=args.broker_id,
        ),
    )
    document = _replica_document(info)
    return document, {k: v for k, v in document.items() if k != "replicas"}


def handoff_master(client: ControllerClient, args):
    """Asks the broker set's master (found through the controller) to hand off: it stops
    taking sends, lets those in flight finish and has the controller elect an in-sync slave."""
    import grpc

    from mqmeta.pb import broker_pb2, broker_pb2_grpc
    from mqmeta.rpc import from_rpc_error

    info = client.get_replica_info(_ref(args))  # NOT_FOUND for an unknown broker set
    if not info.master_broker_id:
        raise FailedPrecondition(
            f"{args.cluster}/{args.broker_name} has no master to hand off; see `sync-state`"
        )
    with tls.channel(info.master_address) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        try:
            reply = stub.Handoff(
                broker_pb2.HandoffRequest(preferred_broker_id=args.broker_id), timeout=args.timeout
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
    document = {
        "broker_name": args.broker_name,
        "previous_master_broker_id": info.master_broker_id,
        "master_broker_id": reply.master_broker_id,
        "master_address": reply.master_address,
        "master_epoch": reply.master_epoch,
        "unavailable_ms": reply.unavailable_ms,
    }
    return document, document


def clean_broker(client: ControllerClient, args):
    reply = client.clean_broker_data(
        pb.CleanBrokerDataRequest(
            cluster=args.cluster, broker_name=args.broker_name, broker_ids=args.broker_id, force=args.force
        ),
    )
    document = {
        "cleaned_broker_ids": list(reply.cleaned_broker_ids),
        "broker_set_removed": reply.broker_set_removed,
    }
    return document, document


def _topic_spec(args) -> pb.TopicSpec:
    return pb.TopicSpec(
        name=args.name,
        cluster=args.cluster,
        queue_count=args.queues,
        broker_names=args.broker_names,
        perm=args.perm,
        message_type=args.message_type,
        if_queue_count=getattr(args, "if_queues", 0),
    )


def topic_delete(client: ControllerClient, args):
    client.delete_topic(pb.NameRequest(name=args.name))
    return {"deleted": args.name}, {"deleted": args.name}


def topic_list(client: ControllerClient, args):
    topics = [_dict(t) for t in client.list_topics(pb.ListTopicsRequest()).topics]
    return {"topics": topics}, topics


def topic_route(client: ControllerClient, args):
    route = _dict(client.get_topic_route(pb.NameRequest(name=args.name)))
    rows = [
        {
            "broker_name": b["broker_name"],
            "master_broker_id": b["master_broker_id"],
            "master_address": b["master_address"],
            "master_epoch": b["master_epoch"],
            "addresses": b["addresses"],
        }
        for b in route["brokers"]
    ]
    return route, rows


def _subscriptions(items: list[str]) -> list[pb.Subscription]:
    subs = []
    for item in items:
        topic, _, expression = item.partition(":")
        if not topic:
            raise InvalidArgument(f"--subscription {item!r} needs a topic: TOPIC[:EXPRESSION]")
        subs.append(pb.Subscription(topic=topic, expression=expression or "*"))
    return subs


def _group_spec(args) -> pb.GroupSpec:
    return pb.GroupSpec(
        name=args.name,
        subscriptions=_subscriptions(args.subscription),
        consume_from=args.consume_from,
        consume_timestamp_ms=args.consume_timestamp_ms,
        retry_max_times=args.retry_max_times,
        retry_policy=args.retry_policy,
    )


def group_delete(client: ControllerClient, args):
    client.delete_group(pb.NameRequest(name=args.name))
    return {"deleted": args.name}, {"deleted": args.name}


def group_list(client: ControllerClient, args):
    groups = [_dict(g) for g in client.list_groups(pb.ListGroupsRequest()).groups]
    return {"groups": groups}, groups


def config_get(client: ControllerClient, args):
    values = dict(client.get_config(pb.GetConfigRequest()).values)
    return values, [{"key": k, "value": v} for k, v in sorted(values.items())]


def config_set(client: ControllerClient, args):
    changes = {}
    for pair in args.pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"{pair!r} is not KEY=VALUE")
        changes[key] = value
    values = dict(client.update_config(pb.UpdateConfigRequest(values=changes)).values)
    return values, [{"key": k, "value": v} for k, v in sorted(values.items())]


def _each_replica(client: ControllerClient, args, method: str, request: Any) -> list[Json]:
    """Asks every replica of a broker set directly; an unreachable one is reported as such."""
    import grpc

    from mqmeta.pb import broker_pb2_grpc

    info = client.get_replica_info(_ref(args))
    answers = []
    for replica in info.replicas:
        with tls.channel(replica.address) as channel:
            stub = broker_pb2_grpc.BrokerServiceStub(channel)
            try:
                answers.append(_dict(getattr(stub, method)(request, timeout=args.timeout)))
            except grpc.RpcError as error:
                answers.append(
                    {
                        "broker_id": replica.broker_id,
                        "address": replica.address,
                        "error": error.details() or str(error.code()),
                    }
                )
    return answers


def ha_status(client: ControllerClient, args):
    from mqmeta.pb import broker_pb2

    replicas = _each_replica(client, args, "GetHaStatus", broker_pb2.HaStatusRequest())
    shared = ("cluster", "broker_name")  # the same on every replica: above the table
    columns = list(dict.fromkeys(k for r in replicas for k in r if k not in shared))
    rows = [{k: _slaves_text(r[k]) if k == "slaves" else r.get(k, "") for k in columns} for r in replicas]
    return {"broker_name": args.broker_name, "replicas": replicas}, _Report(
        {"cluster": args.cluster, "broker_name": args.broker_name}, rows, by_column=True
    )


def _slaves_text(slaves: list[Json]) -> str:
    """A master's slaves in one cell: `ID: acked OFFSET, lag N B, in sync, fetched N ms ago`."""
    return "; ".join(
        f"{s.get('broker_id')}: acked {s.get('acked_offset')}, lag {s.get('lag_bytes')} B, "
        f"{'in sync' if s.get('in_sync') else 'not in sync'}, fetched {s.get('last_fetch_ms_ago')} ms ago"
        for s in slaves
    )


def broker_epoch(client: ControllerClient, args):
    from mqmeta.pb import broker_pb2

    replicas = _each_replica(client, args, "GetEpochCache", broker_pb2.EpochCacheRequest())
    rows = [
        {k: r.get(k) for k in ("broker_id", "entries", "max_offset", "confirm_offset", "error")}
        for r in replicas
    ]
    return {"broker_name": args.broker_name, "replicas": replicas}, rows


def tiered_status(client: ControllerClient, args):
    """The controller's checkpoint beside the master's confirm offset."""
    import grpc

    from mqmeta.pb import broker_pb2, broker_pb2_grpc

    checkpoint = client.get_tiered_checkpoint(_ref(args))
    info = client.get_replica_info(_ref(args))
    confirm = None
    if info.master_address:
        with tls.channel(info.master_address) as channel:
            try:
                confirm = (
                    broker_pb2_grpc.BrokerServiceStub(channel)
                    .GetHaStatus(broker_pb2.HaStatusRequest(), timeout=args.timeout)
                    .confirm_offset
                )
            except grpc.RpcError:
                confirm = None
    document = {
        "broker_name": args.broker_name,
        "uploaded_offset": checkpoint.uploaded_offset,
        "confirm_offset": confirm,
        "checkpoint_epoch": checkpoint.checkpoint_epoch,
        "segments": len(checkpoint.segments),
        "lag_bytes": None if confirm is None else max(0, confirm - checkpoint.uploaded_offset),
        "inflight_upload_id": checkpoint.inflight_upload_id,
        "abandoned_uploads": len(checkpoint.abandoned_upload_ids),
    }
    return document, document


def replicator_status(client: ControllerClient, args):
    """Per rule: its tasks (worker, lease epoch, checkpoint, the stats the worker reported)
    and their sums; the table has one row per task."""
    reply = client.get_replicator_status(pb.GetReplicatorStatusRequest(rule=args.rule))
    rules, rows = [], []
    for rule in reply.rules:
        tasks = []
        for status in rule.tasks:
            stats = status.stats
            task = {
                "topic": status.task.topic,
                "broker_name": status.task.broker_name,
                "queue_id": status.task.queue_id,
                "worker": status.worker_id,
                "epoch": status.epoch,
                "running": status.running,
                "start_offset": status.start_offset,
                "acked_offset": status.acked_offset,
                "replicated": stats.replicated,
                "lag_messages": stats.lag_messages,
                "delay_ms": stats.delay_ms,
                "last_sync_ms": stats.last_sync_ms,
                "messages_per_s": round(stats.messages_per_s, 3),
                "errors": stats.errors,
            }
            tasks.append(task)
            queue = f"{task['topic']}/{task['broker_name']}/{task['queue_id']}"
            rows.append(
                {
                    "rule": rule.name,
                    "task": queue,
                    **{k: task[k] for k in ("worker", "epoch", "replicated", "lag_messages", "delay_ms")},
                    "msg/s": task["messages_per_s"],
                }
            )
        rules.append(
            {
                "name": rule.name,
                "tasks": tasks,
                "replicated": rule.replicated,
                "lag_messages": rule.lag_messages,
                "delay_ms": rule.delay_ms,
                "last_sync_ms": rule.last_sync_ms,
                "messages_per_s": round(rule.messages_per_s, 3),
            }
        )
    workers = [
        {
            "worker_id": w.worker_id,
            "running": [
                {"rule": t.rule, "topic": t.topic, "broker_name": t.broker_name, "queue_id": t.queue_id}
                for t in w.running
            ],
        }
        for w in reply.workers
    ]
    return {"rules": rules, "workers": workers}, rows


def _utc_text(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")


def history_page(client: ControllerClient, args):
    """One page of the applied commands (GetCommandHistory), from the leader; the table
    shows FENCED and refused outcomes with their sentence."""
    reply = client.get_command_history(
        pb.GetCommandHistoryRequest(
            limit=args.limit, before_index=args.before, command_types=args.command_types
        )
    )
    commands = [
        {
            "index": c.index,
            "term": c.term,
            "position": c.position,
            "command": c.command,
            "fields": dict(sorted(c.fields.items())),
            "result": c.result,
            "code": c.code,
            "message": c.message,
            "time_ms": c.time_ms,
        }
        for c in reply.commands
    ]
    document = {
        "commands": commands,
        "next_before_index": reply.next_before_index,
        "oldest_index": reply.oldest_index,
        "last_applied_index": reply.last_applied_index,
        "node_id": reply.node_id,
    }
    rows = [
        {
            "index": c["index"],
            "term": c["term"],
            "time": _utc_text(c["time_ms"]) if c["time_ms"] else "",
            "command": c["command"],
            "fields": " ".join(f"{k}={v}" for k, v in c["fields"].items()),
            "result": c["result"].upper() + (f" {c['code']}: {c['message']}" if c["code"] else ""),
        }
        for c in commands
    ]
    fields = {"node": reply.node_id, "oldest index held": reply.oldest_index}
    if reply.next_before_index:
        fields["older"] = f"--before {reply.next_before_index}"
    return document, _Report(fields, rows)


def _put(call: Callable[[ControllerClient, Any], Any], spec: Callable[[Any], Any]) -> Callable:
    def handler(client: ControllerClient, args):
        document = _dict(call(client, spec(args)))
        return document, document

    return handler


topic_create = _put(ControllerClient.create_topic, _topic_spec)
topic_update = _put(ControllerClient.update_topic, _topic_spec)
group_create = _put(ControllerClient.create_group, _group_spec)
group_update = _put(ControllerClient.update_group, _group_spec)
