"""Hypothesis strategies for any protobuf request, built from its message descriptor.

`any_message(descriptor)` draws every kind of field: ints at and past their edges
(negative, huge), floats incl. NaN and infinities, empty, long and non-ASCII strings,
bytes up to BYTES_MAX, enums with unknown values, repeated and map fields, nested messages
to NESTING_MAX levels, and oneofs (at most one member set, as on the wire).
`nearly_valid(descriptor, known)` starts from a request whose fields named in `known` hold
real values (an existing topic, broker set, group...) and breaks one field, so that a
server's validation is passed up to that field rather than failing at the first check.

`services()` compiles proto/ (protoc from grpc_tools) into a private descriptor pool: no
generated module is imported, so a test process that also holds the official RocketMQ
client (it registers apache.rocketmq.v2 in the default pool, as mqmeta's stubs would) can
fuzz both mqmeta.v1 and apache.rocketmq.v2.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from hypothesis import strategies as st

NESTING_MAX = 3
REPEATED_MAX = 3
STRING_LONG_CHARS = 70_000  # past every name and tag limit, well under gRPC's 4 MiB
BYTES_MAX = 1 << 20  # 1 MiB: big, inside gRPC's default request limit

PROTO_DIR = Path(__file__).resolve().parent.parent.parent / "proto"
_T = FieldDescriptor
_INT_RANGES = {
    _T.TYPE_INT32: (-(2**31), 2**31 - 1),
    _T.TYPE_SINT32: (-(2**31), 2**31 - 1),
    _T.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    _T.TYPE_INT64: (-(2**63), 2**63 - 1),
    _T.TYPE_SINT64: (-(2**63), 2**63 - 1),
    _T.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    _T.TYPE_UINT32: (0, 2**32 - 1),
    _T.TYPE_FIXED32: (0, 2**32 - 1),
    _T.TYPE_UINT64: (0, 2**64 - 1),
    _T.TYPE_FIXED64: (0, 2**64 - 1),
}
_EDGES = (0, 1, -1, 2, 1023, 1024, 65535, 65536, 2**31 - 1, -(2**31), 2**62, 2**63 - 1, -(2**63), 2**64 - 1)
_STRINGS = (
    "",
    " ",
    "a",
    "-",
    "%",
    "|",
    "..",
    "../../etc/passwd",
    "a/b",
    "a\x00b",
    "名字",
    "\U0001f600",
    "127.0.0.1:1",
    "localhost:0",
    "[::1]:99999",
    "*",
    "A || B",
    "x" * 128,
)


def _ints(field_type: int) -> st.SearchStrategy[int]:
    low, high = _INT_RANGES[field_type]
    edges = [v for v in _EDGES if low <= v <= high]
    return st.one_of(
        st.sampled_from(edges),
        st.integers(low, high),
        st.integers(-3, 1100).filter(lambda v: low <= v <= high),
    )


def _strings() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(_STRINGS),
        st.text(max_size=40),
        st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=130),
        st.builds(lambda n: "y" * n, st.sampled_from([127, 1000, STRING_LONG_CHARS])),
    )


def _bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=64),
        st.builds(lambda n: b"\xab" * n, st.sampled_from([4096, 65536, BYTES_MAX])),
    )


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type in _INT_RANGES:
        return _ints(field.type)
    if field.type == _T.TYPE_BOOL:
        return st.booleans()
    if field.type == _T.TYPE_DOUBLE:
        return st.floats(allow_nan=True, allow_infinity=True)
    if field.type == _T.TYPE_FLOAT:
        return st.floats(width=32, allow_nan=True, allow_infinity=True)
    if field.type == _T.TYPE_STRING:
        return _strings()
    if field.type == _T.TYPE_BYTES:
        return _bytes()
    if field.type == _T.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-(2**31), 2**31 - 1))  # proto3 enums are open
    raise AssertionError(f"no strategy for field {field.full_name} of type {field.type}")


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == _T.TYPE_MESSAGE and field.message_type.GetOptions().map_entry and field.is_repeated


def services() -> dict[str, ServiceDescriptor]:
    """Every service of proto/ by full name, from a private pool (see the module text)."""
    from grpc_tools import protoc

    # Ours import each other as mqmeta/pb/NAME.proto (as tools/protogen.py compiles them).
    files = [f"mqmeta/pb/{p.name}" for p in sorted(PROTO_DIR.glob("*.proto"))]
    files += sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.glob("apache/rocketmq/v2/*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        includes = [
            f"-Imqmeta/pb={PROTO_DIR}",
            f"-I{PROTO_DIR}",
            f"-I{Path(protoc.__file__).parent / '_proto'}",
        ]
        args = ["protoc", *includes]
        code = protoc.main([*args, "--include_imports", f"--descriptor_set_out={out}", *files])
        assert code == 0, f"protoc failed on {PROTO_DIR} with exit code {code}"
        descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_set.file:
        pool.Add(file)
    found = {}
    for file in descriptor_set.file:
        for service in file.service:
            full_name = f"{file.package}.{service.name}"
            found[full_name] = pool.FindServiceByName(full_name)
    return found


def _real_oneofs(descriptor: Descriptor) -> list[Any]:
    """The oneofs of the .proto text (not the synthetic one of each proto3 `optional`)."""
    return [o for o in descriptor.oneofs if not (len(o.fields) == 1 and o.name == "_" + o.fields[0].name)]


def message_class(descriptor: Descriptor) -> Any:
    return message_factory.GetMessageClass(descriptor)


@st.composite
def _fill_field(draw: st.DrawFn, message: Any, field: FieldDescriptor, depth: int) -> None:
    """Sets `field` of `message` to a drawn value (a nested message below NESTING_MAX only)."""
    name = field.name
    if _is_map(field):
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        if value_field.type == _T.TYPE_MESSAGE:
            return  # no map of messages in our requests' reach; nothing to draw
        entries = draw(st.dictionaries(scalar(key_field), scalar(value_field), max_size=REPEATED_MAX))
        getattr(message, name).update(entries)
    elif field.type == _T.TYPE_MESSAGE:
        if depth >= NESTING_MAX:
            return
        count = draw(st.integers(0, REPEATED_MAX)) if field.is_repeated else 1
        for _ in range(count):
            value = draw(any_message(field.message_type, depth + 1))
            if field.is_repeated:
                getattr(message, name).add().CopyFrom(value)
            else:
                getattr(message, name).CopyFrom(value)
    elif field.is_repeated:
        getattr(message, name).extend(draw(st.lists(scalar(field), max_size=REPEATED_MAX)))
    else:
        setattr(message, name, draw(scalar(field)))


@st.composite
def any_message(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> Any:
    """A message of `descriptor` with a drawn subset of its fields set, one member per oneof."""
    message = message_class(descriptor)()
    chosen_oneof = {o.name: draw(st.sampled_from([None, *o.fields])) for o in _real_oneofs(descriptor)}
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if oneof is not None and oneof in _real_oneofs(descriptor):
            if chosen_oneof[oneof.name] is not field:
                continue
        elif not draw(st.booleans()):
            continue
        draw(_fill_field(message, field, depth))
    return message


def template(descriptor: Descriptor, known: dict[str, Any], depth: int = 0) -> Any:
    """A message of `descriptor` whose fields named in `known` ("field", or "Message.field"
    first) hold those values, nested messages filled the same way (a oneof: its first
    member only)."""
    message = message_class(descriptor)()
    seen_oneofs: set[str] = set()
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if oneof is not None and oneof in _real_oneofs(descriptor):
            if oneof.name in seen_oneofs:
                continue
            seen_oneofs.add(oneof.name)
        value = known.get(f"{descriptor.name}.{field.name}", known.get(field.name))
        if _is_map(field):
            continue
        if field.type == _T.TYPE_MESSAGE and depth < NESTING_MAX and value is None:
            nested = template(field.message_type, known, depth + 1)
            if nested.ByteSize():
                target = getattr(message, field.name)
                (target.add() if field.is_repeated else target).CopyFrom(nested)
        elif value is not None and field.type != _T.TYPE_MESSAGE:
            if field.is_repeated:
                getattr(message, field.name).extend(value if isinstance(value, list) else [value])
            else:
                setattr(message, field.name, value)
    return message


@st.composite
def nearly_valid(draw: st.DrawFn, descriptor: Descriptor, known: dict[str, Any]) -> Any:
    """template(descriptor, known) with one top-level field (or none) given a drawn value."""
    message = template(descriptor, known)
    fields = list(descriptor.fields)
    broken = draw(st.sampled_from([None, *fields])) if fields else None
    if broken is not None:
        message.ClearField(broken.name)
        draw(_fill_field(message, broken, 0))
    return message


def requests(descriptor: Descriptor, known: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Half arbitrary messages, half nearly valid ones."""
    return st.one_of(any_message(descriptor), nearly_valid(descriptor, known))
