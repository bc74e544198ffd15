"""The broker side: message storage (records, commit log, epoch file, store)."""

from broker_agent.commitlog import CommitLog
from broker_agent.epoch_file import EpochFile, consistent_point
from broker_agent.records import (
    RECORD_BODY_MAX,
    Message,
    StoredRecord,
    TornRecord,
    decode_record,
    encode_record,
    iter_records,
    make_msg_id,
)
from broker_agent.store import CONSUMER_OFFSET_TOPIC, MessageStore, PutResult

__all__ = [
    "CONSUMER_OFFSET_TOPIC",
    "RECORD_BODY_MAX",
    "CommitLog",
    "EpochFile",
    "Message",
    "MessageStore",
    "PutResult",
    "StoredRecord",
    "TornRecord",
    "consistent_point",
    "decode_record",
    "encode_record",
    "iter_records",
    "make_msg_id",
]
