"""The replicator's configuration file (TOML): its settings and its routing rules.

    [replicator]                    # optional
    controllers = "HOST:PORT,..."   # task leases and checkpoints (Raft); unset: run every task
    worker_id = "w1"                # and metrics_listen: the command's flags (flags win)
    [[rules]]
    name = "orders-dr"
    source_namesrv = "HOST:PORT"
    target_namesrv = "HOST:PORT"
    topic = "Orders"                # exact name or re:REGEX (system topics, %..., never match)
    tags = "*"                      # RocketMQ tag expression: *, a || b
    target_topic = "{topic}"        # rename template ({topic}, {source_cluster}) or a name
    mode = "enqueue"                # or "full": consumer progress too
    start = "latest"                # or "earliest", or an ISO timestamp

Everything is validated when the file is read, each rule on its own and the rules
together; a bad file is one InvalidArgument naming the rule and the field. Pure and
standard-library only: the worker, the controller's status and the Spark audit (X1)
read rules through this module, so a rule means the same thing everywhere.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mqmeta.errors import InvalidArgument
from mqmeta.validate import NAME_PATTERN, parse_addresses

MODES = ("enqueue", "full")
STARTS = ("latest", "earliest")
REGEX_PREFIX = "re:"
TEMPLATE_FIELDS = ("topic", "source_cluster")
RULES_MAX = 256
TAGS_EXPRESSION_BYTES_MAX = 1024
SYSTEM_TOPIC_PREFIX = "%"

# `mqmeta replicator`'s flags, also keys of [replicator] (mqmeta.config_file reads them).
FLAG_KEYS = ("worker_id", "metrics_listen")
SETTINGS_DEFAULTS: dict[str, int] = {
    "heartbeat_interval_ms": 500,
    "lease_ms": 1500,
    "dead_after_ms": 2500,
    "batch_count_max": 256,
    "batch_bytes_max": 4 << 20,
    "inflight_batches_max": 32,
    "commit_interval_ms": 500,
    "offsets_interval_ms": 1000,
    "discovery_interval_ms": 2000,
}
SETTINGS_BOUNDS: dict[str, tuple[int, int]] = {
    "heartbeat_interval_ms": (50, 60_000),
    "lease_ms": (100, 600_000),
    "dead_after_ms": (200, 600_000),
    "batch_count_max": (1, 1024),
    "batch_bytes_max": (1024, 32 << 20),
    "inflight_batches_max": (1, 256),
    "commit_interval_ms": (50, 60_000),
    "offsets_interval_ms": (100, 600_000),
    "discovery_interval_ms": (100, 600_000),
}
RULE_KEYS = (
    "name",
    "source_namesrv",
    "target_namesrv",
    "topic",
    "tags",
    "target_topic",
    "mode",
    "start",
    "groups",
)


@dataclass(frozen=True)
class TagExpression:
    """A RocketMQ tag expression: `*` (every message) or `A || B` (those tags only)."""

    text: str
    tags: frozenset[str] | None  # None: every message

    def matches(self, tags: str) -> bool:
        return self.tags is None or tags in self.tags


def parse_tags(text: str) -> TagExpression:
    """ValueError with what is wrong when `text` is not a tag expression."""
    stripped = text.strip()
    if stripped in ("", "*"):
        return TagExpression("*", None)
    if len(stripped.encode()) > TAGS_EXPRESSION_BYTES_MAX:
        raise ValueError(f"is over {TAGS_EXPRESSION_BYTES_MAX} bytes")
    tags = [t.strip() for t in stripped.split("||")]
    if any(not t or "|" in t or "*" in t for t in tags):
        raise ValueError("is not a tag expression: use * or TagA || TagB")
    return TagExpression(" || ".join(tags), frozenset(tags))


@dataclass(frozen=True)
class Rule:
    name: str
    source_namesrv: tuple[str, ...]
    target_namesrv: tuple[str, ...]
    topic: str  # as written: a name or re:REGEX
    tags: TagExpression
    target_topic: str  # the template
    mode: str
    start: str  # latest | earliest | the ISO timestamp as written
    start_ms: int  # the timestamp's epoch ms; 0 for latest / earliest
    groups: TagExpression  # full mode: the consumer groups whose progress is replicated ("*": all)
    _pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches_topic(self, topic: str) -> bool:
        if topic.startswith(SYSTEM_TOPIC_PREFIX):
            return False
        if self._pattern is not None:
            return self._pattern.fullmatch(topic) is not None
        return topic == self.topic

    def target_topic_of(self, topic: str, source_cluster: str) -> str:
        name = self.target_topic.format(topic=topic, source_cluster=source_cluster)
        if not NAME_PATTERN.fullmatch(name):
            raise InvalidArgument(
                f"rule {self.name}: target topic {name!r} (from {topic}) is not a valid name"
            )
        return name

    def definition(self) -> dict[str, Any]:
        """The rule as canonical JSON-able data (what its digest covers)."""
        data = asdict(self)
        data.pop("_pattern")
        data["tags"] = self.tags.text
        data["groups"] = self.groups.text
        data["source_namesrv"] = list(self.source_namesrv)
        data["target_namesrv"] = list(self.target_namesrv)
        return data

    @property
    def digest(self) -> str:
        text = json.dumps(self.definition(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ReplicatorConfig:
    controllers: tuple[str, ...]
    rules: tuple[Rule, ...]
    settings: dict[str, int]

    def rule(self, name: str) -> Rule:
        return next(r for r in self.rules if r.name == name)


def load_config(path: Path) -> ReplicatorConfig:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InvalidArgument(f"config file {path} does not exist") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read config file {path}: {exc.strerror}") from None
    return parse_config(text, str(path))


def parse_config(text: str, where: str = "the config") -> ReplicatorConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{where} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"replicator", "rules"})
    if unknown:
        raise InvalidArgument(f"{where}: unknown table {unknown[0]!r}; use [replicator] and [[rules]]")
    section = data.get("replicator", {})
    if not isinstance(section, dict):
        raise InvalidArgument(f"{where}: replicator must be a table: [replicator]")
    # Without controllers a worker runs every task itself and resumes from the targets'
    # origin tables; with them it runs the tasks leased to it (replicator.leases).
    controllers = (
        _addresses(section["controllers"], "[replicator] controllers") if "controllers" in section else []
    )
    settings = _settings(section)
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise InvalidArgument(f"{where}: give at least one [[rules]] table")
    if len(raw_rules) > RULES_MAX:
        raise InvalidArgument(f"{where}: at most {RULES_MAX} rules")
    rules = tuple(parse_rule(raw, i) for i, raw in enumerate(raw_rules))
    _check_together(rules)
    return ReplicatorConfig(tuple(controllers), rules, settings)


def _addresses(value: Any, what: str) -> list[str]:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what} is missing; give HOST:PORT[,HOST:PORT...]")
    return parse_addresses(value, what)


def _settings(section: dict[str, Any]) -> dict[str, int]:
    known = {*SETTINGS_DEFAULTS, "controllers", *FLAG_KEYS}
    unknown = sorted(set(section) - known)
    if unknown:
        raise InvalidArgument(f"[replicator] has an unknown key {unknown[0]!r}; known: {sorted(known)}")
    settings = dict(SETTINGS_DEFAULTS)
    for key, (low, high) in SETTINGS_BOUNDS.items():
        value = section.get(key, settings[key])
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidArgument(f"[replicator] {key} must be a whole number from {low} to {high}")
        settings[key] = value
    if settings["dead_after_ms"] < 3 * settings["heartbeat_interval_ms"]:
        raise InvalidArgument(
            "[replicator] dead_after_ms must be at least 3 x heartbeat_interval_ms, "
            "or one lost heartbeat would take a worker's tasks away"
        )
    if settings["lease_ms"] >= settings["dead_after_ms"]:
        raise InvalidArgument(
            "[replicator] lease_ms must be below dead_after_ms, so that a worker cut off from "
            "the controllers stops before its tasks are given to another"
        )
    return settings


def parse_rule(raw: Any, position: int) -> Rule:
    """One [[rules]] table; InvalidArgument naming the rule and the field."""
    label = f"rules[{position}]"
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{label} is not a table")
    name = raw.get("name")
    if isinstance(name, str) and NAME_PATTERN.fullmatch(name):
        label = f"rule {name!r}"
    elif name is None:
        raise InvalidArgument(f"{label}: field 'name' is missing")
    else:
        raise InvalidArgument(
            f"{label}: field 'name' {name!r} is malformed: use 1-127 of A-Z a-z 0-9 _ - % |"
        )
    unknown = sorted(set(raw) - set(RULE_KEYS))
    if unknown:
        raise InvalidArgument(f"{label}: unknown field {unknown[0]!r}; known: {', '.join(RULE_KEYS)}")
    source = _rule_addresses(raw, "source_namesrv", label, required=True)
    target = _rule_addresses(raw, "target_namesrv", label, required=True)
    if set(source) & set(target):
        raise InvalidArgument(
            f"{label}: field 'target_namesrv' names the source cluster's nameserver; "
            "a rule replicates into another cluster"
        )
    topic, pattern = _topic(raw, label)
    tags = _tag_field(raw, "tags", label)
    target_topic = _target_topic(raw, label)
    mode = _choice(raw, "mode", MODES, label)
    start, start_ms = _start(raw, label)
    groups = _tag_field(raw, "groups", label)
    return Rule(
        name=name,
        source_namesrv=tuple(source),
        target_namesrv=tuple(target),
        topic=topic,
        tags=tags,
        target_topic=target_topic,
        mode=mode,
        start=start,
        start_ms=start_ms,
        groups=groups,
        _pattern=pattern,
    )


def _rule_addresses(raw: dict[str, Any], key: str, label: str, required: bool) -> list[str]:
    value = raw.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{label}: field {key!r} is missing; give HOST:PORT[,HOST:PORT...]")
    try:
        return parse_addresses(value, "address")
    except InvalidArgument as exc:
        raise InvalidArgument(f"{label}: field {key!r}: {exc.message}") from None


def _topic(raw: dict[str, Any], label: str) -> tuple[str, re.Pattern[str] | None]:
    topic = raw.get("topic")
    if not isinstance(topic, str) or not topic:
        raise InvalidArgument(f"{label}: field 'topic' is missing; give a topic name or re:REGEX")
    if topic.startswith(REGEX_PREFIX):
        try:
            return topic, re.compile(topic[len(REGEX_PREFIX) :])
        except re.error as exc:
            raise InvalidArgument(
                f"{label}: field 'topic' {topic!r} is not a valid regular expression: {exc}"
            ) from None
    if not NAME_PATTERN.fullmatch(topic) or topic.startswith(SYSTEM_TOPIC_PREFIX):
        raise InvalidArgument(
            f"{label}: field 'topic' {topic!r} is not a topic name (1-127 of A-Z a-z 0-9 _ - |, "
            "not a system topic) nor re:REGEX"
        )
    return topic, None


def _tag_field(raw: dict[str, Any], key: str, label: str) -> TagExpression:
    value = raw.get(key, "*")
    if not isinstance(value, str):
        raise InvalidArgument(f'{label}: field {key!r} must be a string such as "*" or "TagA || TagB"')
    try:
        return parse_tags(value)
    except ValueError as exc:
        raise InvalidArgument(f"{label}: field {key!r} {value!r} {exc}") from None


def _target_topic(raw: dict[str, Any], label: str) -> str:
    template = raw.get("target_topic", "{topic}")
    if not isinstance(template, str) or not template:
        raise InvalidArgument(
            f"{label}: field 'target_topic' must be a name or a template such as \"{{topic}}\""
        )
    try:
        sample = template.format(topic="t", source_cluster="c")
    except (KeyError, IndexError, ValueError):
        raise InvalidArgument(
            f"{label}: field 'target_topic' {template!r} is not a template: "
            "use {topic} and {source_cluster} only"
        ) from None
    if not NAME_PATTERN.fullmatch(sample) or sample.startswith(SYSTEM_TOPIC_PREFIX):
        raise InvalidArgument(f"{label}: field 'target_topic' {template!r} does not make a valid topic name")
    return template


def _choice(raw: dict[str, Any], key: str, choices: tuple[str, ...], label: str) -> str:
    value = raw.get(key, choices[0])
    if value not in choices:
        raise InvalidArgument(f"{label}: field {key!r} {value!r} is not one of {', '.join(choices)}")
    return str(value)


def _start(raw: dict[str, Any], label: str) -> tuple[str, int]:
    value = raw.get("start", "latest")
    if isinstance(value, datetime.datetime):  # TOML's own date-time type
        moment = value
    elif value in STARTS:
        return str(value), 0
    elif isinstance(value, str):
        try:
            moment = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise InvalidArgument(
                f"{label}: field 'start' {value!r} is not latest, earliest or an ISO timestamp "
                "such as 2026-01-31T12:00:00Z"
            ) from None
    else:
        raise InvalidArgument(f"{label}: field 'start' must be latest, earliest or an ISO timestamp")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)  # a timestamp without a zone is UTC
    return moment.isoformat(), int(moment.timestamp() * 1000)


def _check_together(rules: tuple[Rule, ...]) -> None:
    names = [r.name for r in rules]
    for name in names:
        if names.count(name) > 1:
            raise InvalidArgument(f"rule {name!r}: field 'name' is used by more than one rule")
    seen: dict[tuple[Any, ...], str] = {}
    for rule in rules:
        same = (frozenset(rule.source_namesrv), frozenset(rule.target_namesrv), rule.topic, rule.target_topic)
        if same in seen:
            raise InvalidArgument(
                f"rule {rule.name!r}: field 'topic' {rule.topic!r} is already replicated to the same target "
                f"topic by rule {seen[same]!r}; a message would be stored twice"
            )
        seen[same] = rule.name
