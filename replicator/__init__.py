"""Cross-cluster replication workers (P7): rules, tasks, origin-keyed exactly-once sends."""

from mqmeta.replicator.worker import add_replicator_parser, run_replicator

__all__ = ["add_replicator_parser", "run_replicator"]
