"""Shared fixtures: a real 3-node controller cluster on loopback per test that asks; and how
the run is laid out over pytest-xdist's workers.

The suite runs on two workers (`-n 2 --dist loadgroup` in pyproject.toml): most tests wait
on real processes more than they compute. Each module is one group, so a module's shared
cluster is built once, on one worker. Every test marked `spark` (the modules that start
the shared Spark session) is in one group, on one worker, one after the other, and the
session and its JVM stop after the last of them instead of using a core for the rest of
the run.
"""

from __future__ import annotations

import pytest

from cluster.harness import Cluster


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = "spark" if item.get_closest_marker("spark") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if item.get_closest_marker("spark") and (nextitem is None or not nextitem.get_closest_marker("spark")):
        from spark.session import stop_session

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
