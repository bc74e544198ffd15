"""On-disk formats: the only place a byte layout, a checksum rule or a file-replacement
protocol is written. Pure Python and the standard library only (and google-crc32c,
imported by mqmeta.formats.checksum on first use): the Spark executors import this
package and must not need grpc.
"""
