"""The state machine's topics, groups, topic_route() and update_config.

Properties checked: topics and groups are created, updated (a conditional update is a
compare-and-set on queue_count) and deleted, with argument validation; a queue_count of 0
means "use default_queue_count" (proto3 cannot tell 0 from unset), so it is not rejected;
results are copies, not the stored state; a topic's route is derived from the topic and
its broker sets; update_config checks value ranges and relations.
"""

from __future__ import annotations

import pytest
from mqmeta.controller.state_machine import (
    CONFIG_SCHEMA,
    ControllerState,
    topic_route,
)

from mqmeta.errors import InvalidArgument, NotFound
from mqmeta.validate import QUEUE_COUNT_MAX
from tests.support.state_machine import (
    CLUSTER,
    Controller,
    Json,
    alive,
    clean,
)

# Topics ---------------------------------------------------------------------------------
# Groups ---------------------------------------------------------------------------------
# update_config --------------------------------------------------------------------------


def test_topic_create_update_delete():
    ctl = Controller()
    result = ctl.ok("put_topic", name="t")
    topic = result["topic"]
    assert topic == {
        "name": "t",
        "cluster": "DefaultCluster",
        "queue_count": 8,
        "broker_names": [],
        "perm": "RW",
        "message_type": "NORMAL",
        "version": ctl.index,
    }
    assert ctl.state.get("topic/t") == topic and ctl.state.topics() == [topic]
    assert ctl.last_events == [{"kind": "topic", "name": "t", "cluster": "DefaultCluster"}]
    ctl.rejected("TOPIC_EXISTS", "put_topic", name="t", queue_count=4)
    ctl.rejected("TOPIC_NOT_FOUND", "put_topic", name="u", mode="update")
    ctl.rejected("INVALID_ARGUMENT", "put_topic", name="u", mode="upsert")
    result = ctl.ok("put_topic", name="t", mode="update", queue_count=16, perm="R", message_type="FIFO")
    assert result["topic"]["queue_count"] == 16 and result["topic"]["perm"] == "R"
    assert result["topic"]["message_type"] == "FIFO"
    assert ctl.state.get("topic/t")["version"] == ctl.index
    ctl.ok("delete_topic", name="t")
    assert ctl.state.get("topic/t") is None and ctl.state.topics() == []
    assert ctl.last_events[0]["kind"] == "topic"
    ctl.rejected("TOPIC_NOT_FOUND", "delete_topic", name="t")
    ctl.rejected("INVALID_ARGUMENT", "delete_topic", name="bad name")
    with pytest.raises(NotFound) as raised:
        topic_route(ctl.state, "t")
    assert raised.value.code == "TOPIC_NOT_FOUND"
    assert ctl.state.digest == ControllerState().digest


def test_topic_update_keeps_what_it_leaves_empty():
    ctl = Controller()
    ctl.ok("put_topic", name="t", queue_count=16, message_type="FIFO")
    updated = ctl.ok("put_topic", name="t", mode="update", perm="R")["topic"]
    assert (updated["queue_count"], updated["message_type"], updated["perm"]) == (16, "FIFO", "R")


def test_conditional_topic_update_is_a_compare_and_set_on_queue_count():
    ctl = Controller()
    ctl.ok("put_topic", name="t", queue_count=4)
    assert (
        ctl.ok("put_topic", name="t", mode="update", queue_count=5, if_queue_count=4)["topic"]["queue_count"]
        == 5
    )
    ctl.rejected("TOPIC_CHANGED", "put_topic", name="t", mode="update", queue_count=6, if_queue_count=4)
    ctl.rejected("INVALID_ARGUMENT", "put_topic", name="u", queue_count=6, if_queue_count=4)
    ctl.rejected("TOPIC_NOT_FOUND", "put_topic", name="u", mode="update", queue_count=6, if_queue_count=4)
    assert ctl.state.get("topic/t")["queue_count"] == 5


def test_results_are_copies_not_the_stored_state():
    ctl = Controller()
    result = ctl.ok("put_topic", name="t")
    result["topic"]["queue_count"] = 99  # a careless caller
    assert ctl.state.get("topic/t")["queue_count"] == 8
    assert ctl.state.digest == ctl.state.recompute_digest()


def test_zero_queue_count_means_the_configured_default_and_bounds_are_inclusive():
    # proto3 cannot tell 0 from unset, so 0 asks for default_queue_count
    ctl = Controller()
    assert ctl.ok("put_topic", name="a", queue_count=0)["topic"]["queue_count"] == 8
    ctl.ok("update_config", values={"default_queue_count": "3"})
    assert ctl.ok("put_topic", name="b", queue_count=0)["topic"]["queue_count"] == 3
    assert ctl.ok("put_topic", name="c", queue_count=1)["topic"]["queue_count"] == 1
    big = ctl.ok("put_topic", name="d", queue_count=QUEUE_COUNT_MAX)["topic"]
    assert big["queue_count"] == QUEUE_COUNT_MAX


@pytest.mark.parametrize(
    "field,value",
    [
        ("queue_count", -1),
        ("queue_count", -8),
        ("queue_count", QUEUE_COUNT_MAX + 1),
        ("queue_count", 10**9),
        ("queue_count", "8"),
        ("queue_count", 2.5),
        ("queue_count", True),
        ("perm", "RWX"),
        ("perm", "rw"),
        ("message_type", "BULK"),
        ("message_type", "fifo"),
        ("name", "bad name"),
        ("name", ""),
        ("name", None),
        ("cluster", "a/b"),
        ("broker_names", ["bad name"]),
    ],
)
def test_put_topic_rejects_malformed_arguments(field, value):
    ctl = Controller()
    ctl.ok("put_topic", name="existing")
    ctl.rejected("INVALID_ARGUMENT", "put_topic", **{"name": "t", field: value})
    ctl.rejected("INVALID_ARGUMENT", "put_topic", **{"name": "existing", "mode": "update", field: value})


def two_broker_sets() -> Controller:
    """Cluster C: b1 (brokers 1, 2; master 2) and b2 (broker 1, no master); D: d1."""
    ctl = Controller()
    ctl.register(1, name="b1")
    ctl.register(2, name="b1")
    ctl.register(1, name="b2")
    ctl.register(1, cluster="D", name="d1")
    ctl.elect(alive(1, 2), name="b1", trigger="broker", requester_broker_id=2)
    return ctl


@pytest.mark.parametrize("broker_names", [["nope"], ["d1"], ["b1", "nope"]])
def test_put_topic_on_an_unknown_broker_set_is_refused(broker_names):
    ctl = two_broker_sets()
    ctl.rejected("BROKER_SET_NOT_FOUND", "put_topic", name="t", cluster=CLUSTER, broker_names=broker_names)


def queue(broker_name: str, count: int, perm: str = "RW") -> Json:
    return {"broker_name": broker_name, "read_queue_count": count, "write_queue_count": count, "perm": perm}


def test_topic_route_is_derived_from_topic_and_broker_sets():
    ctl = two_broker_sets()
    ctl.ok("put_topic", name="all", cluster=CLUSTER, queue_count=4)
    assert topic_route(ctl.state, "all") == {
        "topic": "all",
        "message_type": "NORMAL",
        "queues": [queue("b1", 4), queue("b2", 4)],
        "brokers": [
            {
                "cluster": CLUSTER,
                "broker_name": "b1",
                "master_broker_id": 2,
                "master_address": "10.0.0.2:10911",
                "master_epoch": 1,
                "addresses": {1: "10.0.0.1:10911", 2: "10.0.0.2:10911"},
            },
            {
                "cluster": CLUSTER,
                "broker_name": "b2",
                "master_broker_id": 0,
                "master_address": "",
                "master_epoch": 0,
                "addresses": {1: "10.0.0.1:10911"},
            },
        ],
    }
    one = ctl.ok(
        "put_topic", name="one", cluster=CLUSTER, broker_names=["b2", "b2"], perm="W", message_type="DELAY"
    )["topic"]
    assert one["broker_names"] == ["b2"]
    route = topic_route(ctl.state, "one")
    assert route["message_type"] == "DELAY" and route["queues"] == [queue("b2", 8, "W")]
    assert [b["broker_name"] for b in route["brokers"]] == ["b2"]
    d_topic = ctl.ok("put_topic", name="d", cluster="D")["topic"]
    assert d_topic["broker_names"] == [] and topic_route(ctl.state, "d")["queues"] == [queue("d1", 8)]
    # a new broker set joins the cluster: the all-sets topic follows, the pinned one does not
    ctl.register(5, name="b3")
    assert [q["broker_name"] for q in topic_route(ctl.state, "all")["queues"]] == ["b1", "b2", "b3"]
    assert [q["broker_name"] for q in topic_route(ctl.state, "one")["queues"]] == ["b2"]
    # a failover shows in the route
    ctl.ok(
        "alter_sync_state_set",
        cluster=CLUSTER,
        broker_name="b1",
        master_broker_id=2,
        master_epoch=1,
        sync_state_set_epoch=1,
        new_sync_state_set=[1, 2],
        alive=alive(1, 2),
    )
    ctl.elect(alive(1), name="b1", trigger="controller")
    b1 = topic_route(ctl.state, "all")["brokers"][0]
    assert (b1["master_broker_id"], b1["master_address"], b1["master_epoch"]) == (1, "10.0.0.1:10911", 2)
    # a fully cleaned broker set drops out of every route
    clean(ctl, {}, name="b2")
    assert [q["broker_name"] for q in topic_route(ctl.state, "all")["queues"]] == ["b1", "b3"]
    assert topic_route(ctl.state, "one") == {
        "topic": "one",
        "message_type": "DELAY",
        "queues": [],
        "brokers": [],
    }
    with pytest.raises(InvalidArgument) as raised:
        topic_route(ctl.state, "bad name")
    assert raised.value.code == "INVALID_ARGUMENT"


def test_group_create_update_delete():
    ctl = Controller()
    result = ctl.ok(
        "put_group", name="g", subscriptions=[{"topic": "t2", "expression": "TagA || TagB"}, {"topic": "t1"}]
    )
    assert result["group"] == {
        "name": "g",
        "subscriptions": [{"topic": "t1", "expression": "*"}, {"topic": "t2", "expression": "TagA || TagB"}],
        "consume_from": "LAST_OFFSET",
        "consume_timestamp_ms": 0,
        "retry_max_times": 16,
        "retry_policy": "EXPONENTIAL",
        "version": ctl.index,
    }
    assert ctl.state.groups() == [result["group"]]
    assert ctl.last_events == [{"kind": "group", "name": "g", "cluster": ""}]
    ctl.rejected("GROUP_EXISTS", "put_group", name="g")
    ctl.rejected("GROUP_NOT_FOUND", "put_group", name="h", mode="update")
    ctl.rejected("INVALID_ARGUMENT", "put_group", name="h", mode="replace")
    group = ctl.ok(
        "put_group",
        name="g",
        mode="update",
        consume_from="TIMESTAMP",
        consume_timestamp_ms=1234,
        retry_max_times=3,
        retry_policy="FIXED",
    )["group"]
    assert (
        group["consume_from"],
        group["consume_timestamp_ms"],
        group["retry_max_times"],
        group["retry_policy"],
        group["subscriptions"],
    ) == ("TIMESTAMP", 1234, 3, "FIXED", [])
    assert ctl.state.get("group/g") == group and group["version"] == ctl.index
    # a timestamp only counts with TIMESTAMP
    group = ctl.ok(
        "put_group", name="g", mode="update", consume_from="FIRST_OFFSET", consume_timestamp_ms=99
    )["group"]
    assert group["consume_timestamp_ms"] == 0
    ctl.ok("delete_group", name="g")
    assert ctl.state.get("group/g") is None
    ctl.rejected("GROUP_NOT_FOUND", "delete_group", name="g")
    ctl.rejected("INVALID_ARGUMENT", "delete_group", name="")


@pytest.mark.parametrize(
    "fields",
    [
        {"consume_from": "NEWEST"},
        {"consume_from": "TIMESTAMP"},
        {"consume_from": "TIMESTAMP", "consume_timestamp_ms": -5},
        {"retry_max_times": 65},
        {"retry_max_times": -1},
        {"retry_max_times": "3"},
        {"retry_policy": "LINEAR"},
        {"subscriptions": [{"topic": "bad topic"}]},
        {"subscriptions": [{"topic": "t", "expression": "x" * 1025}]},
        {"name": ""},
        {"name": "a" * 128},
    ],
)
def test_put_group_rejects_malformed_arguments(fields):
    ctl = Controller()
    ctl.rejected("INVALID_ARGUMENT", "put_group", **{"name": "g", **fields})


DEFAULT_CONFIG = {name: spec[1] for name, spec in CONFIG_SCHEMA.items()}


def test_update_config_parses_and_stores_values():
    ctl = Controller()
    assert ctl.state.config() == DEFAULT_CONFIG
    result = ctl.ok(
        "update_config", values={"enable_unclean_master_election": "yes", "default_queue_count": " 4 "}
    )
    assert result["config"] == {
        **DEFAULT_CONFIG,
        "enable_unclean_master_election": True,
        "default_queue_count": 4,
    }
    assert ctl.state.config() == result["config"] and ctl.last_events == [{"kind": "config"}]
    for raw, parsed in [("FALSE", False), ("1", True), ("0", False), (True, True), ("no", False)]:
        ctl.ok("update_config", values={"enable_unclean_master_election": raw})
        assert ctl.state.config()["enable_unclean_master_election"] is parsed
    # relations are checked on the merged configuration: both may change together
    ctl.ok("update_config", values={"lease_ms": "5000", "broker_dead_after_ms": "10000"})
    assert ctl.state.config()["lease_ms"] == 5000
    ctl.ok("update_config", values={"default_cluster": "Prod"})
    assert ctl.ok("put_topic", name="t")["topic"]["cluster"] == "Prod"


@pytest.mark.parametrize(
    "values",
    [
        {"lease_ms": "1599"},
        {"broker_dead_after_ms": "1601"},
        {"broker_heartbeat_interval_ms": "50"},
        {"lease_margin_ms": "0"},
        {"default_queue_count": str(QUEUE_COUNT_MAX)},
    ],
)
def test_update_config_accepts_boundaries(values):
    Controller().ok("update_config", values=values)


@pytest.mark.parametrize(
    "values",
    [
        {"no_such_key": "1"},
        {"enable_unclean_master_election": "maybe"},
        {"enable_unclean_master_election": 2},
        {"broker_heartbeat_interval_ms": "49"},
        {"broker_heartbeat_interval_ms": "60001"},
        {"default_queue_count": "0"},
        {"default_queue_count": str(QUEUE_COUNT_MAX + 1)},
        {"lease_ms": "ten"},
        {"lease_ms": "1.5"},
        {"lease_ms": ""},
        {"default_cluster": "bad name"},
        {"broker_heartbeat_interval_ms": "667"},  # 3 x 667 > broker_dead_after_ms 2000
        {"broker_dead_after_ms": "1600"},  # lease 1200 + margin 400 is not below it
        {"broker_dead_after_ms": "899", "lease_ms": "400"},  # < 3 x heartbeat 300
        {"lease_ms": "1600"},  # 1600 + 400 is not below 2000
        {"lease_margin_ms": "800"},  # 1200 + 800 is not below 2000
        {"lease_ms": "1500", "bogus": "1"},  # one bad key rejects the whole change
        {},
        None,
        "lease_ms=1",
    ],
)
def test_update_config_rejects_bad_values_and_relations(values):
    ctl = Controller()
    ctl.ok("update_config", values={"default_queue_count": "5"})
    ctl.rejected("INVALID_ARGUMENT", "update_config", values=values)
    assert ctl.state.config() == {**DEFAULT_CONFIG, "default_queue_count": 5}
