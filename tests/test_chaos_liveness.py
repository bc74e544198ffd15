"""`mqmeta chaos run --liveness defaults` on real processes, with the false-failover checker.

Properties checked: with --liveness defaults the harness leaves the controller's liveness
settings alone (no update_config in any controller's applied log); every kill of the master
is followed by a new master within the default dead-after (a killed master is detected by
the refused connection, not by silence), the checker finds no false failover, and nothing
acknowledged is lost; --liveness takes test or defaults only (exit 2 otherwise).
"""

from __future__ import annotations

import json

import pytest
from mqmeta.chaos.runner import RunConfig, run

from mqmeta.cli import EXIT_BAD_INPUT, main

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

DEFAULT_DEAD_AFTER_MS = 2000  # the controller's default broker_dead_after_ms (docs/operate.md: fast failover)


def test_a_default_liveness_run_replaces_killed_masters_and_has_no_false_failover(tmp_path):
    config = RunConfig(
        fault="leader-kill",
        output_dir=tmp_path / "run",
        fault_target="brokers",
        time_limit_s=16.0,
        interval_s=4.0,
        drain_s=20.0,
        audit=False,
        liveness="defaults",
    )
    outcome = run(config)
    result = outcome.result
    applied = [
        json.loads(line)
        for path in (outcome.output_dir / "cluster").glob("**/applied.jsonl")
        for line in path.read_text().splitlines()
        if line
    ]
    assert applied and not [r for r in applied if r["command_type"] == "update_config"]
    failover = result["failover"]
    assert failover["faultsTouchingMaster"] >= 1, result["faults"]
    assert failover["falseFailoverCount"] == 0, failover
    assert failover["failoverMs"] and max(failover["failoverMs"]) < DEFAULT_DEAD_AFTER_MS, failover
    assert result["queue"]["lostMessageCount"] == 0 and result["queue"]["enqueueSuccessCount"] >= 30
    assert outcome.passed, outcome.failures


def test_liveness_takes_test_or_defaults_only(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["chaos", "run", "--fault", "noop", "--output-dir", str(tmp_path), "--liveness", "fast"])
    assert exit_.value.code == EXIT_BAD_INPUT and "--liveness" in capsys.readouterr().err
