"""Codecs: one module per client protocol, converting between its wire message and our
record (mqmeta.formats.records: a Message to write, a StoredRecord read back), both
ways, and nothing else (no sockets, no metadata, no choice of queue: the caller picks
the queue and the codec puts it in the record's queue_id field).

- rocketmq5: apache.rocketmq.v2 (the RocketMQ 5 gRPC clients);
- remoting: RocketMQ's classic remoting protocol (RocketMQ 4.x clients): frames, headers,
  fastjson bodies and V1 message records; it imports no stubs (its record conversion is
  mqmeta.remoting.messages).

A codec imports the generated stubs of its protocol, so only server processes import
it (see mqmeta.rocketmq on the official client's clashing stubs).
"""
