"""The committed gRPC stubs in mqmeta/pb are exactly what `python -m mqmeta.protogen` makes."""

from __future__ import annotations

from pathlib import Path

from mqmeta import protogen


def test_generated_stubs_are_up_to_date(tmp_path):
    generated = protogen.generate(tmp_path)
    committed = protogen.ROOT / protogen.OUT_PACKAGE
    assert generated, "protoc produced nothing"
    names = {p.name for p in generated}
    assert names == {p.name for p in committed.iterdir() if p.is_file()}, (
        "stub file set differs: run `python -m mqmeta.protogen`"
    )
    for path in generated:
        assert path.read_bytes() == (committed / path.name).read_bytes(), (
            f"{path.name} is stale: run `python -m mqmeta.protogen`"
        )


def test_generated_package_is_not_named_proto():
    assert protogen.OUT_PACKAGE != "proto" and Path(protogen.OUT_PACKAGE).parts[0] == "mqmeta"
