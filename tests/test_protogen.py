"""The committed gRPC stubs in mqmeta/pb are exactly what `python tools/protogen.py` makes."""

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
    names = {p.name for p in generated}
    assert names == {p.name for p in committed.iterdir() if p.is_file()}, (
        "stub file set differs: run `python tools/protogen.py`"
    )
    for path in generated:
        assert path.read_bytes() == (committed / path.name).read_bytes(), (
            f"{path.name} is stale: run `python tools/protogen.py`"
        )


def test_generated_package_is_not_named_proto():
    assert protogen.OUT_PACKAGE != "proto" and Path(protogen.OUT_PACKAGE).parts[0] == "mqmeta"
