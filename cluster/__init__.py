"""Running whole clusters on one machine: the layout of a local cluster, the process
supervisor, readiness checks, `mqmeta local up`, and the test/benchmark/chaos harness.

It starts every process as `python -m mqmeta.cli ...`, so it imports no part's code
to run it; the harness talks to the processes through the client libraries.
"""
