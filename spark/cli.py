"""`mqmeta audit INPUT... --report DIR [--master URL] [--checks IDS]`, and
`mqmeta audit SRC_DIR TARGET_DIR --rules FILE --report DIR` (X1: cross-cluster replication).

Exit 0 when every check holds, 1 when one does not, 2 on bad input (one sentence on
stderr, never a Java stack trace). Also runnable as `python -m mqmeta.spark.cli` (what
spark-submit runs; see docs/audit.md, "On a Spark cluster").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqmeta.spark.errors import BadInput
from mqmeta.spark.registry import CHECK_IDS, parse_ids

from mqmeta.extras import MissingExtra, require_extra, require_for_url

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
RESCANNING_CHECKS = {"B4", "T2", "H1"}  # they read every replica record again: cache them


def add_parser(subparsers: Any) -> None:
    audit = subparsers.add_parser("audit", help="Spark audit of every replicated log on disk")
    _add_arguments(audit)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="a `local up` data dir, a chaos output dir, or node data dirs (paths or file:// URLs)",
    )
    parser.add_argument(
        "--report", required=True, type=Path, help="directory for report.json and report.html"
    )
    parser.add_argument(
        "--master", default=None, help="Spark master URL (default local[*]; spark://HOST:PORT for a cluster)"
    )
    parser.add_argument(
        "--checks", default=None, help=f"checks to run, e.g. R1,B1-B4 (default all: {','.join(CHECK_IDS)})"
    )
    parser.add_argument(
        "--rules",
        default=None,
        type=Path,
        metavar="FILE",
        help="the replicator's rules (TOML): check X1 with INPUTs SRC_DIR TARGET_DIR (two clusters)",
    )


@dataclass
class _Row:
    """A check of report.json as the summary table shows it."""

    id: str
    description: str
    passed: bool
    rows_examined: int
    violation_count: int
    samples: Any = None
    notes: Any = None
    violations: Any = None


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _table(results: list[Any]) -> Any:
    from rich.table import Table

    table = Table(title="mqmeta audit")
    for column in ("check", "description", "result", "rows", "violations"):
        table.add_column(column)
    for r in results:
        table.add_row(
            r.id,
            r.description,
            "[green]pass[/]" if r.passed else "[bold red]FAIL[/]",
            str(r.rows_examined),
            str(r.violation_count),
        )
    return table


def run_checks(
    inputs: list[str], report_dir: Path, master: str | None, ids: list[str], console: Any = None
) -> int:
    """Discovers, loads, checks and reports; returns the exit status."""
    from mqmeta.spark.data import AuditData
    from mqmeta.spark.layout import discover
    from mqmeta.spark.registry import check_functions
    from mqmeta.spark.report import build_document, write_report
    from mqmeta.spark.session import get_session
    from rich.progress import Progress

    started = time.monotonic()
    inventory = discover(inputs)
    if inventory.empty:
        raise BadInput(
            f"nothing to audit in {', '.join(inputs)}: no applied.jsonl, store/commitlog or tiered "
            "segments found; give a `local up` data dir, a chaos output dir or node data dirs"
        )
    _check_writable(report_dir)
    console = console or _console()
    console.print(f"found {inventory.summary()}")
    with Progress(console=console, transient=False) as progress:
        task = progress.add_task("starting Spark", total=len(ids) + 1)
        spark = get_session(master)
        data = AuditData(spark, inventory, cache_records=bool(RESCANNING_CHECKS & set(ids)))
        progress.advance(task)
        functions = check_functions(data)
        results = []
        for check_id in ids:
            progress.update(task, description=f"check {check_id}")
            results.append(functions[check_id]())
            progress.advance(task)
        progress.update(task, description="writing the report")
        document = build_document(results, inputs, inventory.summary(), time.monotonic() - started)
        write_report(report_dir, document, data)
        data.unpersist()
    console.print(_table(results))
    console.print(f"report: {report_dir / 'report.html'}")
    return EXIT_OK if document["passed"] else EXIT_FAILED


def _check_writable(report_dir: Path) -> None:
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create the report dir {report_dir}: {exc.strerror}") from None
    if not os.access(report_dir, os.W_OK):
        raise BadInput(f"the report dir {report_dir} is not writable")


def _replication_usage(args: argparse.Namespace) -> str | None:
    """Why the arguments do not make a replication audit (X1), or None when they do."""
    asked = {c.strip().upper() for c in (args.checks or "").split(",") if c.strip()}
    if args.rules is None:
        return "check X1 needs --rules FILE and two INPUTs, SRC_DIR TARGET_DIR" if "X1" in asked else None
    if len(args.inputs) != 2:
        return f"--rules takes two INPUTs, SRC_DIR TARGET_DIR; {len(args.inputs)} given"
    if asked - {"X1"}:
        return "with --rules only X1 runs; audit each cluster's dir on its own for the other checks"
    return None


def run(args: argparse.Namespace) -> int:
    try:
        require_extra("audit", "the audit")
        for value in args.inputs:
            require_for_url(value, "an audit input")
    except MissingExtra as error:
        print(f"mqmeta: error: {error.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    problem = _replication_usage(args)
    ids: list[str] = []
    if problem is None and args.rules is None:
        try:
            ids = parse_ids(args.checks)
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"mqmeta: error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if args.rules is not None:
            return _status(
                lambda: run_replication(args.inputs[0], args.inputs[1], args.rules, args.report, args.master)
            )
        return audit_status(args.inputs, args.report, args.master, ids)
    finally:
        from mqmeta.spark.session import stop_session

        stop_session()


def run_replication(
    source: str, target: str, rules: Path, report_dir: Path, master: str | None, console: Any = None
) -> int:
    """X1 over two clusters' dirs (spark.replication); returns the exit status."""
    from mqmeta.spark.replication import audit_replication
    from mqmeta.spark.replication_sites import load_sites
    from mqmeta.spark.session import get_session

    load_sites(source, target, rules)  # bad input is told before Spark starts
    _check_writable(report_dir)
    console = console or _console()
    with console.status("X1: starting Spark"):
        spark = get_session(master)
    with console.status("X1: reading both clusters' records"):
        outcome = audit_replication(spark, source, target, rules, report_dir)
    document = json.loads((report_dir / "report.json").read_text())
    console.print(f"found {document['found']}")
    console.print(_table([_Row(**check) for check in document["checks"]]))
    for kind, count in outcome["violations"].items():
        if count:
            console.print(f"[bold red]{kind}[/]: {count}")
    console.print(f"report: {report_dir / 'report.html'}")
    return EXIT_OK if outcome["ok"] else EXIT_FAILED


def audit_status(
    inputs: list[str],
    report_dir: Path,
    master: str | None,
    ids: list[str],
    console: Any = None,
    prefix: str = "mqmeta: error: ",
) -> int:
    """run_checks' exit status, with bad input and Spark's own failures as exit 2 and one
    sentence on stderr (after `prefix`), never a Python or Java trace."""
    return _status(lambda: run_checks(inputs, report_dir, master, ids, console), prefix)


def _status(run: Callable[[], int], prefix: str = "mqmeta: error: ") -> int:
    """run()'s exit status, with bad input and Spark's own failures as exit 2 and one
    sentence on stderr (after `prefix`), never a Python or Java trace."""
    try:
        return run()
    except BadInput as exc:
        print(f"{prefix}{exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # py4j/pyspark errors: one sentence, never a Java trace
        if type(exc).__module__.startswith(("py4j", "pyspark")):
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            print(f"{prefix}Spark failed: {first}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise


def main(argv: list[str] | None = None) -> int:
    """The entry point of `spark-submit .../spark/cli.py` and `python -m mqmeta.spark.cli`."""
    parser = argparse.ArgumentParser(prog="mqmeta-audit", description=__doc__)
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())


def shared_session_audit(run_dir: Path, report_dir: Path) -> int:
    """The audit of one matrix run, in this process's one Spark session (a JVM start per
    run would cost more than many of the runs' checks). A Spark failure fails this run's
    audit (exit 2, one sentence) and the matrix goes on."""
    import io

    from mqmeta.spark.registry import CHECK_IDS
    from rich.console import Console

    return audit_status(
        [str(run_dir)],
        report_dir,
        None,
        list(CHECK_IDS),
        console=Console(file=io.StringIO()),
        prefix=f"audit of {run_dir}: ",
    )


def stop_shared_session() -> None:
    """Ends the session shared_session_audit used (at the end of a chaos matrix)."""
    from mqmeta.spark.session import stop_session

    stop_session()


def shared_session_replication_audit(
    source_dir: Path, target_dir: Path, rules_path: Path, report_dir: Path
) -> dict[str, Any]:
    """X1 of one replication run in this process's one Spark session (the chaos runner's
    audit hook): spark.replication.audit_replication's dict ({"ok", "violations", ...}).
    Bad input or a Spark failure is {"ok": False, "violations": {}, "error": one sentence},
    never an exception, so a matrix goes on."""
    from mqmeta.spark.replication import audit_replication
    from mqmeta.spark.replication_sites import load_sites
    from mqmeta.spark.session import get_session

    try:
        load_sites(str(source_dir), str(target_dir), Path(rules_path))  # before a JVM is started
        return audit_replication(get_session(None), source_dir, target_dir, rules_path, report_dir)
    except BadInput as exc:
        return {"ok": False, "violations": {}, "error": exc.message}
    except Exception as exc:  # py4j/pyspark errors: one sentence, never a Java trace
        if not type(exc).__module__.startswith(("py4j", "pyspark")):
            raise
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return {"ok": False, "violations": {}, "error": f"Spark failed: {first}"}


def shared_session_replication_status(
    source_dir: Path, target_dir: Path, rules_path: Path, report_dir: Path
) -> int:
    """X1 as the chaos runner's ReplicationAuditFunction: `mqmeta audit SRC TARGET --rules
    FILE --report DIR`'s exit status (0 passed, 1 violations, 2 bad input or Spark failed,
    one sentence on stderr), in this process's one Spark session."""
    import io

    from rich.console import Console

    return _status(
        lambda: run_replication(
            str(source_dir), str(target_dir), rules_path, report_dir, None, Console(file=io.StringIO())
        ),
        prefix=f"X1 audit of {source_dir} -> {target_dir}: ",
    )
