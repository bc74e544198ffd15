"""Pieces shared by the benchmark scripts in bench/: statistics, Linux /proc CPU
accounting, profiling, and run_main(), the common main() structure (one JSON document
on stdout, a watchdog, SIGINT/SIGTERM handling, cleanup).

The scripts run from the repository root as `python -m bench.X` and import this module as
`bench.benchlib`.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The editable install's finder predates broker_agent/: make the repository importable here
# and in every child process (`python -m mqmeta.cli ...`, `python -m bench.X _node`)
# whatever the working directory.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)


def environment() -> dict[str, Any]:
    """What a result's "env" names first: the interpreter, the cores, grpcio and pysyncobj."""
    import platform

    import grpc
    from pysyncobj.version import VERSION

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "grpcio": grpc.__version__,
        "pysyncobj": VERSION,
        "host": "127.0.0.1",
    }


def machine() -> dict[str, Any]:
    """The machine a result was measured on: cores, CPU model, kernel, Python, and the
    load average when the run started."""
    import platform

    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        model = "unknown"
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_at_start": list(os.getloadavg()),
    }


def make_log(tag: str) -> Callable[[str], None]:
    """A progress logger to stderr: `[TAG HH:MM:SS] message`."""

    def log(message: str) -> None:
        print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    return log


# Statistics ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    return None if not a or not b else round(a / b, digits)


def latency_summary(seconds: list[float], with_min: bool = True) -> dict[str, Any]:
    """count, p50/p90/p99/mean/(min)/max in ms of latencies given in seconds."""
    ms = [s * 1000.0 for s in seconds]
    if not ms:
        return {"count": 0}
    out: dict[str, Any] = {
        "count": len(ms),
        "p50_ms": _r(percentile(ms, 50)),
        "p90_ms": _r(percentile(ms, 90)),
        "p99_ms": _r(percentile(ms, 99)),
        "mean_ms": _r(sum(ms) / len(ms)),
    }
    if with_min:
        out["min_ms"] = _r(min(ms))
    out["max_ms"] = _r(max(ms))
    return out


def seconds_summary(samples: list[float], with_p99: bool = True) -> dict[str, Any]:
    """The samples (s) with their count, p50, (p99), max and min."""
    out: dict[str, Any] = {
        "samples_s": [_r(s, 3) for s in samples],
        "count": len(samples),
        "p50_s": _r(percentile(samples, 50)),
    }
    if with_p99:
        out["p99_s"] = _r(percentile(samples, 99))
    out["max_s"] = _r(max(samples)) if samples else None
    out["min_s"] = _r(min(samples)) if samples else None
    return out


# Process CPU accounting (Linux /proc) ---------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int, which: str = "all") -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    user, system = int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK
    return {"all": user + system, "user": user, "system": system}[which]


def context_switches(pid: int) -> int | None:
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                    total += int(line.split()[1])
    except (OSError, ValueError):
        return None
    return total


class CpuMeter:
    """CPU% of named processes over a window (100% = one core).

    stop() returns the CPU% per name and leaves the system-time part in system_percent;
    with switches=True the context switches are counted too, for detail()."""

    def __init__(self, pids: dict[str, int], switches: bool = False) -> None:
        self.pids = pids
        self.start = {n: cpu_seconds(p) for n, p in pids.items()}
        self.start_sys = {n: cpu_seconds(p, "system") for n, p in pids.items()}
        self.start_cs = {n: context_switches(p) for n, p in pids.items()} if switches else {}
        self.t0 = time.monotonic()
        self.system_percent: dict[str, float | None] = {}

    def detail(self, name: str) -> dict[str, Any]:
        """System-time share and context switches per second of one process so far."""
        pid = self.pids[name]
        elapsed = max(1e-6, time.monotonic() - self.t0)
        sys1, cs1 = cpu_seconds(pid, "system"), context_switches(pid)
        sys0, cs0 = self.start_sys.get(name), self.start_cs.get(name)
        return {
            "system_cpu_percent": None
            if sys1 is None or sys0 is None
            else round(100 * (sys1 - sys0) / elapsed, 1),
            "context_switches_per_s": None if cs1 is None or cs0 is None else round((cs1 - cs0) / elapsed),
        }

    def stop(self) -> dict[str, float | None]:
        elapsed = max(1e-6, time.monotonic() - self.t0)
        out: dict[str, float | None] = {}
        for name, pid in self.pids.items():
            end, begin = cpu_seconds(pid), self.start.get(name)
            out[name] = None if end is None or begin is None else round(100 * (end - begin) / elapsed, 1)
            end, begin = cpu_seconds(pid, "system"), self.start_sys.get(name)
            self.system_percent[name] = (
                None if end is None or begin is None else round(100 * (end - begin) / elapsed, 1)
            )
        return out


def proc_stat() -> list[int] | None:
    """The machine's CPU time so far, in clock ticks of all cores: the fields of
    /proc/stat's first line (user, nice, system, idle, iowait, irq, softirq, steal, ...);
    None where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return [int(value) for value in fields[1:]] if fields[:1] == ["cpu"] else None
    except (OSError, ValueError):
        return None


def machine_busy() -> tuple[float, float] | None:
    fields = proc_stat()
    if fields is None:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return float(sum(fields) - idle), float(sum(fields))


def machine_busy_percent(before: tuple[float, float] | None) -> float | None:
    after = machine_busy()
    if before is None or after is None or after[1] == before[1]:
        return None
    return round(100 * (after[0] - before[0]) / (after[1] - before[1]), 1)


# main() ---------------------------------------------------------------------------------


def wait_quiet(max_wait_s: float, threshold: float = 25.0) -> dict[str, Any]:
    """Waits (bounded) until the machine is below `threshold`% busy over 0.5 s: the machine
    may be shared, and foreign load distorts a CPU-bound measurement."""
    t0 = time.monotonic()
    busy = None
    for _ in range(1000):
        before = machine_busy()
        time.sleep(0.5)
        busy = machine_busy_percent(before)
        if busy is None or busy < threshold or time.monotonic() - t0 >= max_wait_s:
            break
    return {"waited_s": round(time.monotonic() - t0, 1), "machine_busy_percent": busy}


def stop_clusters(clusters: list[Any], log: Callable[[str], None]) -> None:
    """cluster.stop() for each (a copy of the list: the run may remove one meanwhile), logging
    and going on past a failure."""
    for cluster in list(clusters):
        try:
            cluster.stop()
        except Exception as exc:  # keep cleaning the rest
            log(f"cleanup: {exc!r}")


class _Report:
    """Prints the result once: at the run's end or from the watchdog, whichever comes first."""

    def __init__(
        self,
        result: dict[str, Any],
        t0: float,
        summarize: Callable[[dict[str, Any]], None],
        json_default: Callable[[Any], Any] | None,
    ) -> None:
        self.result, self.t0, self.summarize, self.json_default = result, t0, summarize, json_default
        self._lock = threading.Lock()
        self._printed = False

    def emit(self, status: str) -> None:
        with self._lock:
            if self._printed:
                return
            self._printed = True
            self.result["status"] = status
            self.result["elapsed_s"] = _r(time.monotonic() - self.t0, 1)
            try:
                self.summarize(self.result)
            except Exception as exc:
                self.result["summary_error"] = repr(exc)
            print(json.dumps(self.result, indent=2, default=self.json_default), flush=True)


def _interrupt_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt (SIGINT also when started with it ignored, `cmd &`)."""

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)


def run_main(
    args: Any,
    root: Path,
    result: dict[str, Any],
    run: Callable[[float], None],
    summarize: Callable[[dict[str, Any]], None],
    cleanup: Callable[[], None],
    log: Callable[[str], None],
    *,
    watchdog_grace_s: float,
    json_default: Callable[[Any], Any] | None = None,
    watchdog_sets_error: bool = False,
) -> int:
    """Run a benchmark and print ONE JSON document (result) on stdout; return the exit code.

    run(t0) does the work, filling result; t0 is the monotonic time the run started.
    result gets "status": "ok" (exit 0), "interrupted" (SIGINT/SIGTERM, 130) or "error"
    (an exception, 1, with "error" and "traceback"), and "elapsed_s"; summarize(result) is
    called just before printing. A watchdog started for args.budget_s + watchdog_grace_s
    prints the result gathered so far with status "time budget exceeded" (and "error"
    when watchdog_sets_error), cleans up and exits with 3. cleanup() runs on every exit;
    root is removed unless args.keep.
    """
    t0 = time.monotonic()
    emit = _Report(result, t0, summarize, json_default).emit

    def watchdog() -> None:
        log(f"time budget of {args.budget_s}s exceeded: stopping")
        if watchdog_sets_error:
            result["error"] = "time budget exceeded"
        emit("time budget exceeded")
        cleanup()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        os._exit(3)

    timer = threading.Timer(args.budget_s + watchdog_grace_s, watchdog)
    timer.daemon = True
    timer.start()
    _interrupt_on_signals()
    status = 0
    try:
        run(t0)
        emit("ok")
    except KeyboardInterrupt as exc:
        result["error"] = f"interrupted: {exc}"
        emit("interrupted")
        status = 130
    except Exception as exc:
        result["error"] = repr(exc)
        result["traceback"] = traceback.format_exc()[-3000:]
        log(traceback.format_exc())
        emit("error")
        status = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log("stopping every process")
        cleanup()
        timer.cancel()
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return status


# py-spy (the dev extra pins it) ---------------------------------------------------------


def profile_start(pid: int, out: Path, rate_hz: int = 50) -> subprocess.Popen | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return None
    command = [exe, "record", "--pid", str(pid), "--rate", str(rate_hz), "--format", "raw"]
    command += ["--output", str(out), "--nonblocking", "--duration", "600"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_stop(proc: subprocess.Popen | None, out: Path, top: int = 12) -> dict[str, Any]:
    """Stops py-spy (SIGINT makes it write its file) and summarizes the collapsed stacks:
    the functions most often on top of a stack (self) and anywhere in it (inclusive)."""
    if proc is None:
        return {"error": "py-spy is not installed (pip install py-spy, the dev extra pins it)"}
    proc.send_signal(2)
    try:
        proc.wait(timeout=30.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    try:
        lines = out.read_text().splitlines()
    except OSError as exc:
        return {"error": f"no profile written: {exc}"}
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        frames = [_frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return {
        "samples": total,
        "self_top": [[f, n, _r(100 * n / max(1, total), 1)] for f, n in own.most_common(top)],
        "inclusive_top": [[f, n, _r(100 * n / max(1, total), 1)] for f, n in inclusive.most_common(top)],
        "columns": ["function (file)", "samples", "percent of samples"],
    }


def _frame_name(frame: str) -> str:
    """'apply (controller/state_machine.py:612)' -> 'apply (state_machine.py)'."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({Path(path).name})" if path else name
