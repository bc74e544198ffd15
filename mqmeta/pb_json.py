"""Protobuf messages as JSON for scripts (`--json` of the admin commands): protobuf's own
rendering writes int64 fields as strings; scripts get numbers."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

Json = dict[str, Any]

_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def message_to_json(message: Any) -> Json:
    """A message as JSON for scripts: protobuf renders int64 as strings; we keep numbers."""
    document = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _numbers(message.DESCRIPTOR, document)


def _numbers(descriptor: Any, document: Json) -> Json:
    for field in descriptor.fields:
        value = document.get(field.name)
        if value is None:
            continue
        if field.type in _INT64_TYPES:
            document[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            items = value if isinstance(value, list) else [value]
            for item in items:
                _numbers(field.message_type, item)
    return document
