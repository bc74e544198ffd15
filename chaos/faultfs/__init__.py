"""A LazyFS-like fault filesystem: a FUSE mount over a real directory that keeps every
write in a page cache of its own until fsync/fdatasync (and every create, rename and
unlink until its directory is fsynced), and on command loses power, stalls fsyncs or
reads, fails an fsync with EIO, or is full (ENOSPC). See cache.py for the semantics.
"""

from mqmeta.chaos.faultfs.control import FaultFsControl, default_control_path
from mqmeta.chaos.faultfs.mount import FaultFs, check_can_mount

# Importing this package never loads libfuse3 (only the mount's own process does, in
# mount.serve), so `mqmeta` runs on a machine without FUSE.

__all__ = ["FaultFs", "FaultFsControl", "check_can_mount", "default_control_path"]
