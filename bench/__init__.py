"""The benchmarks: run each from the repository root as `python -m bench.NAME` (e.g.
`python -m bench.broker_bench --help`). Shared pieces: bench.benchlib (statistics, CPU
accounting, profiling, the common main()) and bench.brokerlib (the bench broker cluster).
"""
