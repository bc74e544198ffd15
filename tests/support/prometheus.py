"""Scraping a process's Prometheus text (`--metrics-listen`) in the tests."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(address: str) -> Samples:
    """Every sample by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def delta(after: Samples, before: Samples, name: str) -> float:
    """How much an unlabelled counter grew between two scrapes."""
    return after.get((name, ()), 0.0) - before.get((name, ()), 0.0)
