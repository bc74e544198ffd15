"""mqmeta: a Raft-replicated metadata and controller service for RocketMQ-style brokers.

The installed distribution is this one package; the repository's top-level parts are
its subpackages (``mqmeta.controller``, ``mqmeta.broker_agent``, ``mqmeta.replicator``,
``mqmeta.cluster``, ``mqmeta.spark``, ``mqmeta.chaos``).
"""

__version__ = "0.2.0"
