"""The reserved record properties: what RocketMQ keeps as a message's system properties,
written by the brokers' RocketMQ 5 and remoting services and read by both (a message sent
through one protocol is received through the other with the same id, born time and host).
User properties may not use the prefix."""

PROPERTY_PREFIX = "__RMQ_"
MESSAGE_ID = "__RMQ_MSG_ID"  # the client-made message id
MESSAGE_TYPE = "__RMQ_TYPE"
BORN_MS = "__RMQ_BORN_MS"
BORN_HOST = "__RMQ_BORN_HOST"
MESSAGE_GROUP = "__RMQ_GROUP"
DELIVER_MS = "__RMQ_DELIVER_MS"  # delay and transaction messages: where they wait
REAL_TOPIC = "__RMQ_REAL_TOPIC"
DLQ_ORIGIN = "__RMQ_DLQ_ORIGIN"  # topic/queue/offset of the message a DLQ record copies
RECONSUME_TIMES = "__RMQ_RECONSUME_TIMES"  # deliveries that failed before this copy
RESENT_FROM = "__RMQ_RESENT_FROM"  # the id of the message an admin's resend copies
RETRY_TOPIC = "RETRY_TOPIC"  # RocketMQ's: the topic a retry copy came from (clients restore it)
RETRY_PREFIX = "%RETRY%"  # a group's retry topic: %RETRY%{group}
DEAD_LETTER_PREFIX = "%DLQ%"  # a group's dead-letter topic: %DLQ%{group}
KEY_SEPARATOR = " "  # RocketMQ's: keys are stored space-separated
