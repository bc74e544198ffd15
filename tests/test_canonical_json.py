"""canonical_json gives, for every JSON value, the text json.dumps(sort_keys=True,
separators=(",", ":")) gives (state digests, applied-entry lines and checksummed files
are taken over it: a node of this version must agree with one of an older version, and
with what its own snapshots recorded), and refuses what is not JSON as json.dumps does."""

from __future__ import annotations

import json
import random

import pytest

from mqmeta.formats.checksummed import canonical_json

pytestmark = pytest.mark.timeout(30)


def _reference(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.randrange(-(2**70), 2**70)
    if kind == 1:
        return rng.choice([0.1, -2.5e-300, 1e300, 3.0, float("inf"), float("-inf")])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4, 5):
        return "".join(rng.choice('ab\\"\n\x01é€😀/') for _ in range(rng.randrange(8)))
    if kind in (6, 7):
        return {
            rng.choice(["b", "a", "é", "10", "9", "", "z"]) + str(rng.randrange(3)): _random_value(
                rng, depth + 1
            )
            for _ in range(rng.randrange(5))
        }
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]


def test_every_value_has_the_text_json_dumps_gives():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for _ in range(3000):
        value = _random_value(rng)
        assert canonical_json(value) == _reference(value), f"seed {seed}: {value!r}"
    topic = {"name": "t", "cluster": "c", "queue_count": 4, "broker_names": ["b", "a"], "version": 7}
    assert canonical_json(topic) == _reference(topic)
    assert canonical_json({2: "int key", 1.5: "float key", True: "bool key"}) == _reference(
        {2: "int key", 1.5: "float key", True: "bool key"}
    )


def test_what_is_not_json_is_refused():
    with pytest.raises(TypeError, match="not JSON serializable"):
        canonical_json({"a": {1, 2}})
    with pytest.raises(TypeError):
        canonical_json({("a", 1): 1})
