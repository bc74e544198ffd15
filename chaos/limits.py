"""The ranges of a chaos run's numbers: the CLI refuses a flag outside them at parse time and
RunConfig.validate checks them again for runs configured in code."""

CONCURRENCY_MAX = 64  # client threads
CONSUMERS_MAX = 16
RATE_MIN, RATE_MAX = 0.1, 2000.0  # operations per second
TIME_S_MIN, TIME_S_MAX = 1.0, 24 * 3600.0  # a run's time limit
INTERVAL_S_MIN = 0.5  # the fault interval; at most the time limit
