"""Timing defaults the controller and the brokers share, and how they must relate: one source.

The controller's configuration (controller/state_machine.CONFIG_SCHEMA) starts from the
`*_DEFAULT` values, and a broker assumes them until it has read the controller's
configuration (at registration). The relations are asserted here at import and checked
again where an operator can change one side (controller/raft_node.RaftSettings.validate,
controller/state_machine.validate_config_relations).
"""

from __future__ import annotations

# The controller's configuration (ControllerConfig values), in milliseconds.
BROKER_HEARTBEAT_INTERVAL_MS_DEFAULT = 300
BROKER_DEAD_AFTER_MS_DEFAULT = 2000
LEASE_MS_DEFAULT = 1200
LEASE_MARGIN_MS_DEFAULT = 400
# The controller's [raft_settings] proposal_timeout_ms: a write not committed by then fails
# with an unknown outcome (it may still commit).
PROPOSAL_TIMEOUT_MS_DEFAULT = 5000
# How long a broker keeps writes refused after a SyncStateSet proposal or a handoff election
# failed with an unknown outcome: the controller may still commit it until its proposal
# timeout has passed, so the grace must outlast every proposal timeout a controller allows.
PENDING_GRACE_MS = 7000
PROPOSAL_TIMEOUT_MS_MAX = PENDING_GRACE_MS - 1000
# A Watch stream (a broker's, a route copy's) runs on a channel that pings its controller
# node every WATCH_KEEPALIVE_MS and fails the stream when a ping goes unanswered for
# WATCH_KEEPALIVE_TIMEOUT_MS: a silently cut stream (a stopped process, a black-holed link,
# a connection closed without a FIN reaching the client) ends within about their sum and is
# opened again, instead of waiting forever while the changes it should carry pass it by.
WATCH_KEEPALIVE_MS = 1_000
WATCH_KEEPALIVE_TIMEOUT_MS = 2_000

assert BROKER_DEAD_AFTER_MS_DEFAULT >= 3 * BROKER_HEARTBEAT_INTERVAL_MS_DEFAULT
assert LEASE_MS_DEFAULT + LEASE_MARGIN_MS_DEFAULT < BROKER_DEAD_AFTER_MS_DEFAULT
assert PROPOSAL_TIMEOUT_MS_DEFAULT <= PROPOSAL_TIMEOUT_MS_MAX < PENDING_GRACE_MS
