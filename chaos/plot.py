"""Latency point graph of a queue-workload history (OpenChaos's latency graph), written as PNG.

x is seconds since the history's first event, y is latency in ms on a log scale: enqueue send
latency (successful enqueues), dequeue end-to-end latency, and failed or unknown enqueues
marked with a cross at their send latency. Fault intervals are shaded; a fault without an end
is shaded to the end of the plot. Latencies below `LATENCY_FLOOR_MS` are drawn at the floor,
since a log axis has no zero.

Rendering uses the Agg canvas directly on a `Figure`, never pyplot: no global figure registry,
no GUI backend, safe from any thread, and the process-wide backend is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from mqmeta.chaos.checkers import DEQUEUE, ENQUEUE
from mqmeta.chaos.history import FaultEvent, FaultPhase, HistoryEvent, Result, responses

LATENCY_FLOOR_MS = 0.1
FIGURE_SIZE_INCHES = (12.0, 5.0)
DOTS_PER_INCH = 100


def latency_png(history: Sequence[HistoryEvent], path: str | Path) -> Path:
    """Draw the latency graph of `history` to a PNG file at `path`; return the path."""
    figure = Figure(figsize=FIGURE_SIZE_INCHES, dpi=DOTS_PER_INCH)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_xlabel("time since start (s)")
    axes.set_ylabel("latency (ms)")
    if not history:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes, fontsize=16)
    else:
        start_ms = min(event.timestamp_ms for event in history)
        end_s = (max(event.timestamp_ms for event in history) - start_ms) / 1000
        point_count = _draw_latency_points(axes, history, start_ms)
        _shade_faults(axes, history, start_ms, end_s)
        if point_count:
            axes.set_yscale("log")
            axes.legend(loc="upper right")
        else:
            axes.text(0.5, 0.5, "no latency data", ha="center", va="center", transform=axes.transAxes)
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target, format="png")
    return target


def _draw_latency_points(axes: Axes, history: Sequence[HistoryEvent], start_ms: int) -> int:
    """Scatter the three series; return how many points were drawn."""
    series: dict[str, tuple[list[float], list[float], str, str]] = {
        "enqueue send latency": ([], [], "tab:blue", "."),
        "dequeue end-to-end latency": ([], [], "tab:green", "."),
        "enqueue failure/unknown": ([], [], "tab:red", "x"),
    }
    for response in responses(history):
        if response.operation == ENQUEUE:
            name = "enqueue send latency" if response.result == Result.SUCCESS else "enqueue failure/unknown"
            latency_ms = response.send_latency_ms
        elif response.operation == DEQUEUE and response.end_to_end_latency_ms >= 0:
            name, latency_ms = "dequeue end-to-end latency", response.end_to_end_latency_ms
        else:
            continue
        times_s, latencies_ms, _, _ = series[name]
        times_s.append((response.timestamp_ms - start_ms) / 1000)
        latencies_ms.append(max(float(latency_ms), LATENCY_FLOOR_MS))
    point_count = 0
    for name, (times_s, latencies_ms, color, marker) in series.items():
        if times_s:
            marker_size = 6 if marker == "." else 18
            axes.scatter(times_s, latencies_ms, s=marker_size, c=color, marker=marker, label=name)
            point_count += len(times_s)
    return point_count


def _shade_faults(axes: Axes, history: Sequence[HistoryEvent], start_ms: int, end_s: float) -> None:
    intervals_s: list[tuple[float, float]] = []
    open_fault_start_s: float | None = None
    for event in history:
        if not isinstance(event, FaultEvent):
            continue
        time_s = (event.timestamp_ms - start_ms) / 1000
        if event.phase == FaultPhase.START and open_fault_start_s is None:
            open_fault_start_s = time_s
        elif event.phase == FaultPhase.END and open_fault_start_s is not None:
            intervals_s.append((open_fault_start_s, time_s))
            open_fault_start_s = None
    if open_fault_start_s is not None:
        intervals_s.append((open_fault_start_s, end_s))  # end_s is the last event: never before the start
    for index, (from_s, to_s) in enumerate(intervals_s):
        axes.axvspan(from_s, to_s, color="tab:orange", alpha=0.2, label=None if index else "fault")
