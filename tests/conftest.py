"""Shared fixtures: a real 3-node controller cluster on loopback per test that asks; and how
the run is laid out over pytest-xdist's workers.

The suite runs on two workers (`-n 2` in pyproject.toml): most tests wait
on real processes more than they compute. Each module is one scope, so a module's shared
cluster is built once, on one worker. Every test marked `spark` (the modules that start
the shared Spark session) is in one scope, on one worker, one after the other, and the
session and its JVM stop after the last of them instead of using a core for the rest of
the run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from mqmeta.cluster.harness import Cluster

# The suite's audits are of small data dirs, in the shared session and in `mqmeta audit`
# processes: the JVM's quicker compiler alone makes them faster (docs/audit.md).
os.environ.setdefault("MQMETA_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")

# The modules whose tests use the shared Spark session (marked `spark`): one scope.
SPARK_MODULES = frozenset(
    {
        "test_audit.py",
        "test_audit_replication.py",
        "test_chaos_corrupt.py",
        "test_chaos_grey_faults.py",
        "test_chaos_power_loss.py",
        "test_chaos_runs.py",
        "test_rocketmq_chaos.py",
    }
)


def _scope(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return "spark" if Path(module).name in SPARK_MODULES else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling (a scope's tests go to one worker, in order) with every
    Spark module in one scope. (Its `loadgroup` mode leaves groups split with pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SparkTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return SparkTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marked = item.get_closest_marker("spark") is not None
        if marked != (item.path.name in SPARK_MODULES):
            raise pytest.UsageError(
                f"{item.nodeid}: mark a module `spark` exactly when SPARK_MODULES lists it"
            )


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if item.get_closest_marker("spark") and (nextitem is None or not nextitem.get_closest_marker("spark")):
        from mqmeta.spark.session import stop_session

        stop_session()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path / "cluster").start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def cluster_factory(tmp_path):
    made: list[Cluster] = []

    def make(**kwargs) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(made)}", **kwargs)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.stop()
