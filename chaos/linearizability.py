"""Linearizability checker for the metadata workload: a key-value register with read/write/cas.

The algorithm is Wing & Gong's search with Lowe's memoisation (WGL), as Porcupine implements it:
walk the history's call/return entries in time order; at a call, try to linearize that
operation now (the model must accept it) and restart from the first remaining entry; at a
return of an operation not yet linearized, backtrack. A (linearized set, register value) pair
seen before is not explored again. Keys are independent registers, so each key's
sub-history is checked on its own (P-compositionality).

The model (value encoding in `chaos.history`'s docstring; every key starts absent, None):

- read returning v: allowed when the register holds v; no effect.
- write v: always allowed; the register becomes v.
- cas old->new, SUCCESS: allowed when the register holds old; it becomes new.
- cas FAILURE with ``;mismatch``: the service compared and found another value, so it is a
  read of "anything but old" with no effect. A plain cas FAILURE, and a FAILURE of a read or
  write, certainly had no effect and observed nothing: such operations are left out.
- UNKNOWN or missing response: the operation may take effect at any time after its call, or
  never. Its return is placed after the end of the history; "never" is the same as taking
  effect after every other operation, which nobody observes. An unknown cas swaps when the
  register holds old at its linearization point and otherwise does nothing; an unknown read
  says nothing and is left out.

Timestamps are in ms, so two entries with the same timestamp are taken as concurrent (calls
sort before returns), which accepts rather than rejects on ties.

The search is exponential in the worst case, so it is bounded by `state_count_max` explored
states and `time_limit_s` overall; when a bound is hit the answer is None ("unknown").
Before it, one rule needs no search: no operation makes a key absent again, so a read of
"absent" called after a write or cas completed on that key is rejected at once (a cluster
that lost its state answers many of those, among hundreds of unknown writes that make
the search run out of its bounds).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from mqmeta.chaos.history import HistoryError, HistoryEvent, Result, decode_cas_value, pair_operations

TIME_LIMIT_S_DEFAULT = 30.0
STATE_COUNT_MAX_DEFAULT = 2_000_000
COUNTEREXAMPLE_OP_COUNT_MAX = 20
_CLOCK_CHECK_INTERVAL = 1024  # search iterations between deadline checks


class OpKind(StrEnum):
    READ = "read"
    WRITE = "write"
    CAS = "cas"


class Outcome(StrEnum):
    OK = "ok"  # took effect (write, cas) or observed `value` (read)
    MISMATCH = "mismatch"  # cas compared and found a value other than `expected`; no effect
    UNKNOWN = "unknown"  # may have taken effect at any time after invoke_ms, or never


_OPERATION_NAMES = frozenset(kind.value for kind in OpKind)


@dataclass(frozen=True, slots=True)
class RegisterOp:
    client_id: int
    key: str
    kind: OpKind
    value: str | None  # read: the value read; write: the value written; cas: the new value
    expected: str | None  # cas: the old value; None for read and write
    outcome: Outcome
    invoke_ms: int
    complete_ms: int | None  # None: open end (UNKNOWN or no response)

    def to_json(self) -> dict:
        return {
            "client_id": self.client_id,
            "key": self.key,
            "kind": self.kind.value,
            "value": self.value,
            "expected": self.expected,
            "outcome": self.outcome.value,
            "invoke_ms": self.invoke_ms,
            "complete_ms": self.complete_ms,
        }


@dataclass(slots=True)
class _Budget:
    deadline_s: float
    state_count_max: int
    clock: Callable[[], float]
    explored_state_count: int = 0

    def exhausted(self) -> bool:
        return self.explored_state_count >= self.state_count_max or self.clock() >= self.deadline_s


@dataclass(frozen=True, slots=True)
class _KeyVerdict:
    linearizable: bool | None
    counterexample: list[RegisterOp]


def register_operations(history: Sequence[HistoryEvent]) -> list[RegisterOp]:
    """The read/write/cas operations of a history as register operations (see module doc)."""
    operations: list[RegisterOp] = []
    for pair in pair_operations(history):
        request, response = pair.request, pair.response
        if request.operation not in _OPERATION_NAMES:
            continue
        kind = OpKind(request.operation)
        if request.sharding_key is None:
            raise HistoryError(f"{kind} without a key: {request}")
        if response is not None and response.timestamp_ms < request.timestamp_ms:
            raise HistoryError(f"response before its request: {response}")
        unknown = response is None or response.result == Result.UNKNOWN
        complete_ms = None if unknown or response is None else response.timestamp_ms
        outcome = Outcome.UNKNOWN if unknown else Outcome.OK
        value, expected = request.value, None
        if kind == OpKind.CAS:
            cas = decode_cas_value(request.value)
            value, expected = cas.new, cas.old
        if response is not None and response.result == Result.FAILURE:
            if kind != OpKind.CAS or response.value is None or not decode_cas_value(response.value).mismatch:
                continue  # certainly no effect and nothing observed
            outcome = Outcome.MISMATCH
        if kind == OpKind.READ:
            if unknown or response is None:
                continue  # an unanswered read tells nothing
            value = response.value
        operations.append(
            RegisterOp(
                request.client_id,
                request.sharding_key,
                kind,
                value,
                expected,
                outcome,
                request.timestamp_ms,
                complete_ms,
            )
        )
    return operations


def check_linearizability(
    history: Sequence[HistoryEvent],
    time_limit_s: float = TIME_LIMIT_S_DEFAULT,
    state_count_max: int = STATE_COUNT_MAX_DEFAULT,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Check a metadata-workload history; see `check_operations` for the result."""
    return check_operations(register_operations(history), time_limit_s, state_count_max, clock)


def check_operations(
    operations: Sequence[RegisterOp],
    time_limit_s: float = TIME_LIMIT_S_DEFAULT,
    state_count_max: int = STATE_COUNT_MAX_DEFAULT,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Check register operations key by key, smallest key first; stop at the first failing key.

    Returns ``{"linearizable": True | False | None, "keys_checked", "failing_key",
    "counterexample", "unknown_keys", "explored_state_count"}``. ``linearizable`` is None when a
    bound was hit on some key and no key failed. ``keys_checked`` counts keys decided either way.
    ``counterexample`` is the longest linearizable prefix found for the failing key (its last
    operations, capped) followed by the operation that could not be linearized after it.
    """
    if time_limit_s <= 0 or state_count_max <= 0:
        raise ValueError("time_limit_s and state_count_max must be positive")
    budget = _Budget(clock() + time_limit_s, state_count_max, clock)
    by_key: dict[str, list[RegisterOp]] = {}
    for operation in operations:
        by_key.setdefault(operation.key, []).append(operation)
    keys_checked = 0
    unknown_keys: list[str] = []
    failing_key: str | None = None
    counterexample: list[RegisterOp] = []
    for key in sorted(by_key, key=lambda k: (len(by_key[k]), k)):
        verdict = _check_key(by_key[key], budget)
        if verdict.linearizable is None:
            unknown_keys.append(key)
            continue
        keys_checked += 1
        if not verdict.linearizable:
            failing_key, counterexample = key, verdict.counterexample
            break
    linearizable: bool | None = False
    if failing_key is None:
        linearizable = None if unknown_keys else True
    return {
        "linearizable": linearizable,
        "keys_checked": keys_checked,
        "failing_key": failing_key,
        "counterexample": [op.to_json() for op in counterexample],
        "unknown_keys": unknown_keys,
        "explored_state_count": budget.explored_state_count,
    }


def step(state: str | None, operation: RegisterOp) -> tuple[bool, str | None]:
    """The register model: may `operation` take effect on `state`, and the state after it."""
    if operation.kind == OpKind.READ:
        return state == operation.value, state
    if operation.kind == OpKind.WRITE:
        return True, operation.value
    if operation.outcome == Outcome.MISMATCH:
        return state != operation.expected, state
    if operation.outcome == Outcome.OK:
        return state == operation.expected, operation.value
    return True, operation.value if state == operation.expected else state


def _absent_after_a_completed_write(operations: list[RegisterOp]) -> _KeyVerdict | None:
    """A read of "absent" called after a write or a successful cas completed (with a
    value) cannot be linearized, whatever else is open: rejected without a search."""
    written = [
        op
        for op in operations
        if op.kind in (OpKind.WRITE, OpKind.CAS)
        and op.outcome == Outcome.OK
        and op.value is not None
        and op.complete_ms is not None
    ]
    if not written:
        return None
    first = min(written, key=lambda op: op.complete_ms or 0)
    for op in operations:
        if op.kind == OpKind.READ and op.value is None and op.invoke_ms > (first.complete_ms or 0):
            return _KeyVerdict(False, [first, op])
    return None


def _check_key(operations: list[RegisterOp], budget: _Budget) -> _KeyVerdict:
    """WGL over one key. Entry 2*i is operation i's call and 2*i+1 its return."""
    lost = _absent_after_a_completed_write(operations)
    if lost is not None:
        return lost
    next_entry, previous_entry, head = _entry_list(operations)
    seen: set[tuple[int, str | None]] = set()
    stack: list[tuple[int, str | None]] = []  # (operation index, state before it)
    linearized_bits = 0
    state: str | None = None
    best_prefix: list[int] = []
    stuck_index = -1
    entry = next_entry[head]
    iteration_count = 0
    while next_entry[head] != -1:
        iteration_count += 1
        if iteration_count % _CLOCK_CHECK_INTERVAL == 0 and budget.exhausted():
            return _KeyVerdict(None, [])
        index = entry >> 1
        if entry & 1 == 0:
            allowed, state_after = step(state, operations[index])
            candidate = (linearized_bits | (1 << index), state_after)
            if allowed and candidate not in seen:
                seen.add(candidate)
                budget.explored_state_count += 1
                stack.append((index, state))
                linearized_bits, state = candidate
                _lift(entry, next_entry, previous_entry)
                entry = next_entry[head]
            else:
                entry = next_entry[entry]
            continue
        if stuck_index < 0 or len(stack) > len(best_prefix):
            best_prefix, stuck_index = [i for i, _ in stack], index
        if not stack:
            return _KeyVerdict(False, _counterexample(operations, best_prefix, stuck_index))
        index, state = stack.pop()
        linearized_bits &= ~(1 << index)
        _unlift(2 * index, next_entry, previous_entry)
        entry = next_entry[2 * index]
    return _KeyVerdict(True, [])


def _entry_list(operations: list[RegisterOp]) -> tuple[list[int], list[int], int]:
    """A doubly linked list of call/return entries in time order; calls before returns on ties."""

    def sort_key(entry: int) -> tuple[float, int]:
        operation = operations[entry >> 1]
        if entry & 1 == 0:
            return float(operation.invoke_ms), 0
        complete_ms = operation.complete_ms
        return (math.inf if complete_ms is None else float(complete_ms)), 1

    ordered = sorted(range(2 * len(operations)), key=sort_key)
    head = 2 * len(operations)
    next_entry = [-1] * (head + 1)
    previous_entry = [-1] * (head + 1)
    last = head
    for entry in ordered:
        next_entry[last] = entry
        previous_entry[entry] = last
        last = entry
    return next_entry, previous_entry, head


def _lift(call: int, next_entry: list[int], previous_entry: list[int]) -> None:
    """Unlink a call and its return (the call always has a successor: its return)."""
    next_entry[previous_entry[call]] = next_entry[call]
    previous_entry[next_entry[call]] = previous_entry[call]
    ret = call + 1
    next_entry[previous_entry[ret]] = next_entry[ret]
    if next_entry[ret] != -1:
        previous_entry[next_entry[ret]] = previous_entry[ret]


def _unlift(call: int, next_entry: list[int], previous_entry: list[int]) -> None:
    """Relink what `_lift` unlinked, in the reverse order."""
    ret = call + 1
    next_entry[previous_entry[ret]] = ret
    if next_entry[ret] != -1:
        previous_entry[next_entry[ret]] = ret
    next_entry[previous_entry[call]] = call
    previous_entry[next_entry[call]] = call


def _counterexample(operations: list[RegisterOp], prefix: list[int], stuck_index: int) -> list[RegisterOp]:
    tail = prefix[max(0, len(prefix) - (COUNTEREXAMPLE_OP_COUNT_MAX - 1)) :]
    return [operations[i] for i in tail] + [operations[stuck_index]]
