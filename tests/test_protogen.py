"""The committed gRPC stubs in mqmeta/pb (ours and the vendored apache.rocketmq.v2 ones, in
their subpackage) are exactly what `python tools/protogen.py` makes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "protogen", Path(__file__).parent.parent / "tools" / "protogen.py"
)
assert _SPEC is not None and _SPEC.loader is not None
protogen = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(protogen)


def test_generated_stubs_are_up_to_date(tmp_path):
    generated = protogen.generate(tmp_path)
    committed = protogen.ROOT / protogen.OUT_PACKAGE
    assert generated, "protoc produced nothing"
    made = {p.relative_to(tmp_path / protogen.OUT_PACKAGE) for p in generated}
    kept = {
        p.relative_to(committed) for p in committed.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }
    assert made == kept, "stub file set differs: run `python tools/protogen.py`"
    assert Path("apache/rocketmq/v2/service_pb2_grpc.py") in made
    for relative in made:
        assert (tmp_path / protogen.OUT_PACKAGE / relative).read_bytes() == (
            committed / relative
        ).read_bytes(), f"{relative} is stale: run `python tools/protogen.py`"


def test_generated_package_is_not_named_proto():
    assert protogen.OUT_PACKAGE != "proto" and Path(protogen.OUT_PACKAGE).parts[0] == "mqmeta"
