"""Shared fixtures: a real 3-node controller cluster on loopback per test that asks."""

from __future__ import annotations

import pytest

from cluster.harness import Cluster


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
