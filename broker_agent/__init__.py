"""The broker: the commit-log store, the pure role core and its shell (the agent),
replication, tiered storage and the broker's gRPC service. Record, epoch and tiered
formats live in mqmeta.formats."""

from mqmeta.broker_agent.commitlog import CommitLog
from mqmeta.broker_agent.consumer_progress import CONSUMER_OFFSET_TOPIC
from mqmeta.broker_agent.core import BrokerCore
from mqmeta.broker_agent.seams import BrokerHost
from mqmeta.broker_agent.store import MessageStore, PutResult

__all__ = ["CONSUMER_OFFSET_TOPIC", "BrokerCore", "BrokerHost", "CommitLog", "MessageStore", "PutResult"]
