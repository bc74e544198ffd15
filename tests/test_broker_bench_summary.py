"""bench/broker_bench.py's summarize (pure: a result dict in, ratios out), so that the bench's
ratios cannot silently go missing.

Properties checked:
- every throughput run gets its ratio to the raw append of its batch, whether or not the
  ceiling phase ran;
- the ceiling (the slowest of the parallel copies over one raw append of the same batch) is
  reported when it ran, and only for a batch that has a raw append.
"""

from __future__ import annotations

from bench.broker_bench import summarize


def _result(ceiling: list[dict] | None) -> dict:
    raw: dict = {"fsync": [{"batch": 128, "msgs_per_s": 160_000}, {"batch": 256, "msgs_per_s": 200_000}]}
    if ceiling is not None:
        raw["replica_copies_ceiling"] = ceiling
    runs = [
        {"threads": 8, "batch": 128, "msgs_per_s": 40_000},
        {"threads": 16, "batch": 256, "msgs_per_s": 50_000},
        {"threads": 8, "batch": 64, "msgs_per_s": 30_000},  # no raw append of this batch
    ]
    return {"throughput": {"runs": runs, "best": runs[1]}, "raw_append": raw}


def test_each_run_gets_its_ratio_to_the_raw_append_of_its_batch_without_the_ceiling():
    result = _result(ceiling=None)
    summarize(result)
    ratios = result["ratios"]
    assert ratios["t8_b128_vs_raw_b128"] == 0.25
    assert ratios["t16_b256_vs_raw_b256"] == 0.25
    assert not any(name.startswith("t8_b64") for name in ratios)
    assert ratios["throughput_best_vs_raw_append_same_batch"] == 0.25
    assert ratios["throughput_best_vs_raw_append_best"] == 0.25
    assert not any(name.startswith("ceiling_") for name in ratios)


def test_the_ceiling_is_the_slowest_copy_over_one_raw_append_of_the_same_batch():
    ceiling = [
        {"batch": 128, "copies": 3, "msgs_per_s_slowest": 88_000},
        {"batch": 512, "copies": 3, "msgs_per_s_slowest": 99_000},  # no raw append of this batch
    ]
    result = _result(ceiling)
    summarize(result)
    ratios = result["ratios"]
    assert ratios["ceiling_3_copies_b128_vs_raw_b128"] == 0.55
    assert "ceiling_3_copies_b512_vs_raw_b512" not in ratios
    assert ratios["t8_b128_vs_raw_b128"] == 0.25
