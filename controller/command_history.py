"""The commands a controller node applied, newest last: a bounded ring for the history read
(GetCommandHistory, `mqmeta admin history`, the console's timeline).

Each applied command (a Raft entry may carry several: group commit) becomes one record:
its entry's index and term, its place in the entry, its type, its key fields (the
command's JSON without the leader's liveness view, other bulk and empty fields), its outcome and its
time where the command carries one (`now_ms`, stamped by the leader).

The outcome is what `state_machine.apply` answered: "applied" (it may have changed
nothing), "fenced" (a FENCED_* code: a stale master, SyncStateSet or lease epoch; or
NOT_LEADER: decided on the view of a leader of an older term) or "refused" (any other
code), with the code and the sentence.

The ring lives in memory only. A node rebuilds it as it replays the journal entries it
holds after its last snapshot, so the history reaches back to the last compaction (or
HISTORY_COMMANDS_MAX commands, whichever is shorter). Barriers (linearizable reads)
change nothing and are not kept.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from mqmeta.controller.commands import Barrier, Command, Undecodable, command_json

from mqmeta.formats.checksummed import canonical_json

Json = dict[str, Any]

HISTORY_COMMANDS_MAX = 10_000  # commands a node keeps (~1 KB each: fields are cut at FIELD_CHARS_MAX)
PAGE_COMMANDS_MAX = 1_000  # commands one read may ask for
PAGE_COMMANDS_DEFAULT = 100
FIELD_CHARS_MAX = 200  # a field's value past this is cut (a long list of tasks, a config)
COMMAND_TYPES_PER_READ_MAX = 32
# Not key fields: the leader's view of who is alive (bulk), the time (its own column), the
# proposer's term (its refusal says it), a broker's check code, tiered segment lists.
_LEFT_OUT = frozenset({"alive", "now_ms", "leader_term", "check_code", "segments", "epochs"})
APPLIED, FENCED, REFUSED = "applied", "fenced", "refused"


def outcome(result: Json) -> tuple[str, str, str]:
    """(applied | fenced | refused, code, sentence) of one command's result."""
    if result.get("ok", True):
        return APPLIED, "", ""
    code = str(result.get("code", ""))
    fenced = code.startswith("FENCED") or code == "NOT_LEADER"
    return (FENCED if fenced else REFUSED), code, str(result.get("message", ""))


def key_fields(command: Command, document: Json | None = None) -> dict[str, str]:
    """The command's fields a reader wants, each as text (JSON for a list or a map);
    `document` is its command_json when the caller has it already."""
    if isinstance(command, Undecodable):
        return {"reason": command.reason[:FIELD_CHARS_MAX]}
    fields: dict[str, str] = {}
    for name, value in (command_json(command) if document is None else document).items():
        if name == "type" or name in _LEFT_OUT or value in ("", [], {}):
            continue  # an empty field (an update's "keep as is") says nothing
        text = value if isinstance(value, str) else canonical_json(value)
        fields[name] = text if len(text) <= FIELD_CHARS_MAX else text[: FIELD_CHARS_MAX - 1] + "…"
    return fields


class CommandHistory:
    """The ring. `record` runs on the Raft thread; `page` on any reader's."""

    def __init__(self, commands_max: int = HISTORY_COMMANDS_MAX) -> None:
        self._records: collections.deque[Json] = collections.deque(maxlen=commands_max)
        self._lock = threading.Lock()

    def record(
        self,
        index: int,
        term: int,
        commands: Sequence[Command],
        results: Sequence[Json],
        documents: Sequence[Json | None] | None = None,
    ) -> None:
        """One applied entry's commands with their results (what apply answered), and
        their command_json when the caller has them (the applied-entry line's)."""
        records = []
        if documents is None:
            documents = [None] * len(commands)
        for position, (command, result, document) in enumerate(
            zip(commands, results, documents, strict=True)
        ):
            if isinstance(command, Barrier):
                continue
            verdict, code, message = outcome(result)
            records.append(
                {
                    "index": index,
                    "term": term,
                    "position": position,
                    "command": command.TYPE,
                    "fields": key_fields(command, document),
                    "result": verdict,
                    "code": code,
                    "message": message,
                    "time_ms": getattr(command, "now_ms", None) or 0,
                }
            )
        if not records:
            return
        with self._lock:
            while self._records and self._records[-1]["index"] >= index:
                self._records.pop()  # a node that re-applies from an older snapshot: the newer answer
            self._records.extend(records)

    def page(self, limit: int, before_index: int = 0, command_types: Iterable[str] = ()) -> Json:
        """The newest `limit` commands below `before_index` (0: from the newest), of
        `command_types` only when given, newest first. A page ends on an entry's boundary
        (the commands of one entry stay together), so it may hold more than `limit` when
        its last entry carries several. `next_before_index` pages on (0: nothing older is
        held); `oldest_index` is the oldest entry this node holds."""
        wanted = frozenset(command_types)
        found: list[Json] = []
        older = False
        with self._lock:
            oldest_index = self._records[0]["index"] if self._records else 0
            for record in reversed(self._records):
                if before_index and record["index"] >= before_index:
                    continue
                if wanted and record["command"] not in wanted:
                    continue
                if len(found) >= limit and record["index"] != found[-1]["index"]:
                    older = True
                    break
                found.append(record)
        return {
            "commands": [dict(r, fields=dict(r["fields"])) for r in found],
            "next_before_index": found[-1]["index"] if older else 0,
            "oldest_index": oldest_index,
        }
