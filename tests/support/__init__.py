"""What the test modules share (no test module imports another): the one wait helper,
broker-set and controller waits over a real cluster, a fake broker, a cuttable TCP link,
the audit tests' data dir and Spark session, and three in-process pysyncobj nodes with
manual ticks (`tests.support.raft_trio`, imported from there).

Tests wait on a condition through `wait_for` (cluster/wait.py: the same function the
harness and the launcher use), never on a fixed sleep.
"""

from mqmeta.cluster.wait import WaitTimeout, wait_for

from tests.support.audit_data import audit_in_shared_session, clean_data_dir, copy_data_dir, spark_session
from tests.support.broker_sets import consume_all, wait_in_sync, wait_same_end
from tests.support.controllers import topic_names, wait_same_digest
from tests.support.fake_broker import FAST_LIVENESS, FakeBroker
from tests.support.sampling import sample_for
from tests.support.tcp_cut import TcpCut

__all__ = [
    "FAST_LIVENESS",
    "FakeBroker",
    "TcpCut",
    "WaitTimeout",
    "audit_in_shared_session",
    "clean_data_dir",
    "consume_all",
    "copy_data_dir",
    "sample_for",
    "spark_session",
    "topic_names",
    "wait_for",
    "wait_in_sync",
    "wait_same_digest",
    "wait_same_end",
]
