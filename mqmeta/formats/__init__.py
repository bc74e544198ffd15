"""On-disk formats: the only place a byte layout, a checksum rule or a file-replacement
protocol is written. Pure Python and the standard library only (and google-crc32c,
imported by mqmeta.formats.checksum on first use): the Spark executors import this
package and must not need grpc.
"""

# The largest commit-log or queue offset any of our formats or services holds. Offsets are
# u64 on disk, but int64 on the wire (protobuf's int64, RocketMQ's Java long) and in
# Arrow/Spark (bigint), so the signed bound is the one every side can represent.
OFFSET_MAX = (1 << 63) - 1
