"""The audit's report: DIR/report.json and DIR/report.html (with plots where data allows).

Plots: each replica's confirm offset and max offset over time (from confirm.log, which
shows replica lag and the confirm offset), and the election timeline (master epoch and
master id per broker set by Raft index, from the applied entries of one node).
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
from pathlib import Path
from typing import Any

from mqmeta.spark.checks import CheckResult
from mqmeta.spark.data import AuditData
from pyspark.sql import functions as F

PLOT_POINTS_MAX = 20_000


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def _confirm_plot(data: AuditData) -> str | None:
    frame = data.confirm.filter("valid").select("replica", "role", "t_ms", "confirm_offset", "max_offset")
    total = frame.count()
    if total == 0:
        return None
    if total > PLOT_POINTS_MAX:
        frame = frame.sample(fraction=PLOT_POINTS_MAX / total, seed=7)
    rows = frame.orderBy("t_ms").collect()
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 4))
    start = rows[0]["t_ms"]
    for replica in sorted({r["replica"] for r in rows}):
        mine = [r for r in rows if r["replica"] == replica]
        seconds = [(r["t_ms"] - start) / 1000 for r in mine]
        axis.plot(seconds, [r["max_offset"] for r in mine], label=f"{replica} max offset", linewidth=1)
        masters = [
            (s, r["confirm_offset"]) for s, r in zip(seconds, mine, strict=True) if r["role"] == "MASTER"
        ]
        if masters:
            axis.plot(*zip(*masters, strict=True), ".", markersize=3, label=f"{replica} confirm (master)")
    axis.set_xlabel("seconds since the first confirm line")
    axis.set_ylabel("commit offset (bytes)")
    axis.set_title("Replica max offsets (lag) and the master's confirm offset")
    axis.legend(fontsize=7)
    encoded = _png(figure)
    plt.close(figure)
    return encoded


def _election_plot(data: AuditData) -> str | None:
    rows = (
        data.effects.filter(F.col("valid") & F.col("key").startswith("brokerset/"))
        .select("node", "broker_set", "index", "master_broker_id", "master_epoch")
        .collect()
    )
    if not rows:
        return None
    node = sorted({r["node"] for r in rows})[0]
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 3.5))
    for broker_set in sorted({r["broker_set"] for r in rows}):
        mine = sorted(
            (r for r in rows if r["node"] == node and r["broker_set"] == broker_set), key=lambda r: r["index"]
        )
        axis.step(
            [r["index"] for r in mine], [r["master_epoch"] for r in mine], where="post", label=broker_set
        )
        last = None
        for r in mine:
            if r["master_broker_id"] != last:
                axis.annotate(f"master {r['master_broker_id']}", (r["index"], r["master_epoch"]), fontsize=7)
                last = r["master_broker_id"]
    axis.set_xlabel(f"Raft index (applied entries of {node})")
    axis.set_ylabel("master epoch")
    axis.set_title("Election timeline")
    axis.legend(fontsize=7)
    encoded = _png(figure)
    plt.close(figure)
    return encoded


def build_document(
    results: list[CheckResult], inputs: list[str], summary: str, elapsed_s: float
) -> dict[str, Any]:
    return {
        "inputs": inputs,
        "found": summary,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "elapsed_s": round(elapsed_s, 2),
        "passed": all(r.passed for r in results),
        "checks": [r.to_dict() for r in results],
    }


def _check_rows(document: dict[str, Any]) -> str:
    parts = []
    for check in document["checks"]:
        verdict = "pass" if check["passed"] else "FAIL"
        samples = "".join(
            f"<li><code>{html.escape(json.dumps(s, default=str))}</code></li>" for s in check["samples"]
        )
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in check["notes"])
        parts.append(
            f"<tr class='{verdict.lower()}'><td>{check['id']}</td>"
            f"<td>{html.escape(check['description'])}</td>"
            f"<td>{verdict}</td><td>{check['rows_examined']}</td><td>{check['violation_count']}</td>"
            f"<td><ul>{notes}{samples}</ul></td></tr>"
        )
    return "".join(parts)


def write_report(directory: Path, document: dict[str, Any], data: AuditData | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    plots = []
    if data is not None:
        for title, plot in (
            ("Confirm offset and replica lag", _confirm_plot(data)),
            ("Election timeline", _election_plot(data)),
        ):
            if plot:
                plots.append(f"<h2>{title}</h2><img alt='{title}' src='data:image/png;base64,{plot}'>")
    verdict = "every check holds" if document["passed"] else "some checks FAIL"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>mqmeta audit</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}tr.fail td{{background:#fdd}}
tr.pass td:nth-child(3){{color:#070}}code{{font-size:85%}}</style></head><body>
<h1>mqmeta audit: {verdict}</h1>
<p>Inputs: {html.escape(", ".join(document["inputs"]))}<br>Found: {html.escape(document["found"])}<br>
Generated {document["generated_at"]} in {document["elapsed_s"]} s</p>
<table><tr><th>id</th><th>check</th><th>result</th><th>rows examined</th><th>violations</th>
<th>notes and samples (at most 20)</th></tr>{_check_rows(document)}</table>
{"".join(plots)}</body></html>
"""
    (directory / "report.html").write_text(page)
