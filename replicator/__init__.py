"""Cross-cluster replication workers (P7): rules, tasks, origin-keyed exactly-once sends."""
