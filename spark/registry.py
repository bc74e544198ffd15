"""Which checks exist, in report order, and how to run a selection of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the checks import PySpark: `mqmeta --help` parses --checks without it
    from mqmeta.spark.checks import CheckResult
    from mqmeta.spark.data import AuditData

CHECK_IDS = ["R1", "R2", "M1", "M2", "M3", "M4", "B1", "B2", "B3", "B4", "T1", "T2", "T3", "T4", "H1", "K1"]


def check_functions(data: AuditData) -> dict[str, Callable[[], CheckResult]]:
    from mqmeta.spark import checks, checks_keys, checks_logs

    return {
        "R1": lambda: checks.check_r1(data),
        "R2": lambda: checks.check_r2(data),
        "M1": lambda: checks.check_m1(data),
        "M2": lambda: checks.check_m2(data),
        "M3": lambda: checks.check_m3(data),
        "M4": lambda: checks.check_m4(data),
        "B1": lambda: checks_logs.check_b1(data),
        "B2": lambda: checks_logs.check_b2(data),
        "B3": lambda: checks_logs.check_b3(data),
        "B4": lambda: checks_logs.check_b4(data),
        "T1": lambda: checks_logs.check_t1(data),
        "T2": lambda: checks_logs.check_t2(data),
        "T3": lambda: checks_logs.check_t3(data),
        "T4": lambda: checks_logs.check_t4(data),
        "H1": lambda: checks_logs.check_h1(data),
        "K1": lambda: checks_keys.check_k1(data),
    }


def parse_ids(text: str | None) -> list[str]:
    """ "R1,B1-B3" -> ["R1", "B1", "B2", "B3"]; ValueError naming an unknown id."""
    if not text:
        return list(CHECK_IDS)
    chosen: list[str] = []
    for part in (p.strip().upper() for p in text.split(",") if p.strip()):
        if "-" in part:
            first, last = part.split("-", 1)
            if (
                first not in CHECK_IDS
                or last not in CHECK_IDS
                or CHECK_IDS.index(first) > CHECK_IDS.index(last)
            ):
                raise ValueError(f"check range {part!r} is not a range of {', '.join(CHECK_IDS)}")
            chosen += CHECK_IDS[CHECK_IDS.index(first) : CHECK_IDS.index(last) + 1]
        elif part in CHECK_IDS:
            chosen.append(part)
        else:
            raise ValueError(f"unknown check {part!r}; the checks are {', '.join(CHECK_IDS)}")
    return [c for c in CHECK_IDS if c in chosen]
