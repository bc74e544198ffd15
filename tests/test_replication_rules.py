"""The replicator's config file: a good file parses into rules that match the topics and
tags they name and rename as their template says; every bad rule is refused with one
InvalidArgument naming the rule and the field (the CLI turns it into exit 2)."""

from __future__ import annotations

import pytest

from mqmeta.errors import InvalidArgument
from mqmeta.formats.replication_rules import load_config, parse_config, parse_tags

GOOD = """
[replicator]
controllers = "127.0.0.1:9001"
[[rules]]
name = "orders-dr"
source_namesrv = "127.0.0.1:9100"
target_namesrv = "127.0.0.1:9200"
topic = "Orders"
tags = "TagA || TagB"
target_topic = "{source_cluster}-{topic}"
mode = "enqueue"
start = "earliest"
[[rules]]
name = "all"
source_namesrv = "127.0.0.1:9100"
target_namesrv = "127.0.0.1:9200"
topic = "re:Pay.*"
start = "2026-01-31T12:00:00Z"
"""

RULE = """
[[rules]]
name = "r1"
source_namesrv = "127.0.0.1:9100"
target_namesrv = "127.0.0.1:9200"
topic = "Orders"
"""


def test_a_good_config_parses_into_rules_that_match_and_rename():
    config = parse_config(GOOD)
    assert config.controllers == ("127.0.0.1:9001",)
    orders, pay = config.rules
    assert orders.matches_topic("Orders") and not orders.matches_topic("Orders2")
    assert orders.tags.matches("TagA") and orders.tags.matches("TagB") and not orders.tags.matches("TagC")
    assert orders.target_topic_of("Orders", "a") == "a-Orders"
    assert (orders.mode, orders.start, orders.start_ms) == ("enqueue", "earliest", 0)
    assert pay.matches_topic("Payments") and not pay.matches_topic("XPay") and not pay.matches_topic("%SYS")
    assert pay.tags.matches("") and pay.tags.matches("anything")
    assert pay.target_topic_of("Payments", "a") == "Payments"
    assert (pay.mode, pay.start_ms) == ("enqueue", 1769860800000)
    assert orders.digest != pay.digest and orders.digest == parse_config(GOOD).rules[0].digest


def test_the_replicator_table_is_optional():
    assert parse_config(RULE).controllers == ()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ('source_namesrv = ""', "rule 'r1': field 'source_namesrv' is missing"),
        ('target_namesrv = "nohost"', "rule 'r1': field 'target_namesrv'"),
        ('target_namesrv = "127.0.0.1:9100"', "rule 'r1': field 'target_namesrv' names the source"),
        ('mode = "mirror"', "rule 'r1': field 'mode' 'mirror' is not one of enqueue, full"),
        ('topic = "re:(["', "rule 'r1': field 'topic' 're:([' is not a valid regular expression"),
        ('topic = "%SYS"', "rule 'r1': field 'topic'"),
        ('tags = "a || "', "rule 'r1': field 'tags'"),
        ('tags = "a | b"', "rule 'r1': field 'tags'"),
        ('target_topic = "{nope}"', "rule 'r1': field 'target_topic'"),
        ('target_topic = "a b"', "rule 'r1': field 'target_topic'"),
        ('start = "yesterday"', "rule 'r1': field 'start'"),
        ("colour = 1", "rule 'r1': unknown field 'colour'"),
    ],
)
def test_a_bad_field_is_refused_naming_the_rule_and_the_field(change, says):
    key = change.split(" = ")[0]
    lines = [line for line in RULE.splitlines() if not line.startswith(key + " ")]
    with pytest.raises(InvalidArgument) as raised:
        parse_config("\n".join(lines) + "\n" + change + "\n")
    assert says in raised.value.message


def test_a_missing_name_field_and_whole_file_errors_are_one_sentence():
    with pytest.raises(InvalidArgument, match=r"rules\[0\]: field 'name' is missing"):
        parse_config(RULE.replace('name = "r1"', ""))
    with pytest.raises(InvalidArgument, match="at least one"):
        parse_config("[replicator]\n")
    with pytest.raises(InvalidArgument, match="not valid TOML"):
        parse_config("[[rules]\n")
    with pytest.raises(InvalidArgument, match="used by more than one rule"):
        parse_config(RULE + RULE)
    with pytest.raises(InvalidArgument, match="dead_after_ms"):
        parse_config("[replicator]\nheartbeat_interval_ms = 1000\n" + RULE)


def test_load_config_names_a_missing_file(tmp_path):
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    (tmp_path / "ok.toml").write_text(RULE)
    assert load_config(tmp_path / "ok.toml").rules[0].name == "r1"


def test_the_worker_refuses_a_bad_config_with_exit_2_naming_rule_and_field(tmp_path, capsys):
    from mqmeta.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text(RULE + 'mode = "mirror"\n')
    assert main(["replicator", "--config", str(bad)]) == 2
    assert "rule 'r1': field 'mode' 'mirror'" in capsys.readouterr().err


def test_tag_expressions():
    assert parse_tags("*").tags is None and parse_tags("").tags is None
    assert parse_tags(" a ||b ").tags == frozenset({"a", "b"})
    for bad in ("a ||", "||", "a | b", "a*"):
        with pytest.raises(ValueError):
            parse_tags(bad)
