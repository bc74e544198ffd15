"""The layout of docs/development.md (Layout) holds: which part imports which, no cycles, no private names.

An AST scan of every module of the parts (imports inside functions included, since a
lazy import is still a dependency):
- the base package mqmeta/ imports no part above it, except its front door mqmeta/cli.py;
- controller/ and broker_agent/ import only the base; broker_agent/, spark/, chaos/ and
  cluster/ never import controller/ (cluster starts it as a process);
- spark/ imports only mqmeta.formats, .errors, .validate and .extras of ours (its executors need no
  grpc: checked by importing the executor modules in a fresh interpreter);
- a codec (mqmeta/codec/, one module per client protocol) converts and nothing else: it
  imports only the record formats, the stubs, the errors and its protocol's module;
- no module imports another part's private (underscore) name;
- the module import graph has no cycle;
- no test module imports another test module (shared helpers live in tests/support/).
- every command of the front door's table (mqmeta.cli.PART_CLIS) is served by a module with
  top-level add_parser and run, and every part above the base has its cli.py.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
BASE = "mqmeta"
PARTS = ("mqmeta", "controller", "broker_agent", "spark", "chaos", "cluster", "replicator")
FRONT_DOOR = "mqmeta.cli"
# part -> the parts (besides the base) it may import
ALLOWED_ABOVE_BASE: dict[str, tuple[str, ...]] = {
    "controller": (),
    "broker_agent": (),
    "spark": (),
    "chaos": ("cluster",),
    "cluster": ("broker_agent", "replicator"),
    "replicator": (),
}
SPARK_BASE_MODULES = ("mqmeta.formats", "mqmeta.errors", "mqmeta.validate", "mqmeta.extras")
SPARK_EXECUTOR_MODULES = ("spark.sources", "spark.walk", "spark.fs", "spark.messages")
# what a codec (mqmeta.codec.<protocol>) may import of ours
CODEC_MODULES = (
    "mqmeta.codec",
    "mqmeta.formats",
    "mqmeta.pb",
    "mqmeta.errors",
    "mqmeta.validate",
    "mqmeta.rocketmq",
)
INSTALLED_PARTS = PARTS[1:]  # installed as mqmeta.<part>: the scan names them by their folder


def _folder_name(module: str) -> str:
    """`mqmeta.controller.x` (the installed name) -> `controller.x` (its folder here)."""
    head, _, rest = module.partition(".")
    if head == BASE and rest.split(".")[0] in INSTALLED_PARTS:
        return rest
    return module


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")) if (ROOT / part).is_dir() else []:
            if "pb" not in path.relative_to(ROOT).parts:
                found[_module_name(path)] = path
    return found


MODULES = _modules()
# Every module parsed once, here, while pytest collects and no test has started a thread:
# CPython 3.11.7 keeps the AST constructor's recursion depth in interpreter-wide state
# (python/cpython#106905), so a parse that overlaps one in another thread (a traceback
# formatted by a server thread a test left behind parses its source line) fails with
# "SystemError: AST constructor recursion depth mismatch".
TEST_MODULES = sorted((ROOT / "tests").rglob("*.py"))
TREES = {path: ast.parse(path.read_text(), str(path)) for path in [*MODULES.values(), *TEST_MODULES]}


def _imports(name: str, path: Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every import in the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    result = []
    for node in ast.walk(TREES[path]):
        if isinstance(node, ast.Import):
            result += [(_folder_name(alias.name), "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _folder_name(node.module or "")
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                result.append((full, "", node.lineno) if full in MODULES else (base, alias.name, node.lineno))
    return result


def _part(module: str) -> str:
    return module.split(".")[0]


def _ours(module: str) -> bool:
    return _part(module) in PARTS


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for target, _, _ in _imports(name, path):
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].add(target)
    return edges


def test_the_scan_sees_every_part():
    assert {_part(m) for m in MODULES} >= {
        "mqmeta",
        "controller",
        "broker_agent",
        "spark",
        "chaos",
        "cluster",
    }
    assert len(MODULES) > 50


def test_parts_import_only_what_the_layout_allows():
    problems = []
    for name, path in MODULES.items():
        part = _part(name)
        for target, _, line in _imports(name, path):
            if not _ours(target) or _part(target) == part:
                continue
            other = _part(target)
            if part == BASE:
                if name != FRONT_DOOR:
                    problems.append(f"{name}:{line} (base) imports {target}")
            elif part == "spark":
                if not any(target == m or target.startswith(m + ".") for m in SPARK_BASE_MODULES):
                    problems.append(f"{name}:{line} (spark) imports {target}")
            elif other != BASE and other not in ALLOWED_ABOVE_BASE[part]:
                problems.append(f"{name}:{line} ({part}) imports {target}")
    assert not problems, "imports that break the layout (docs/development.md):\n" + "\n".join(problems)


def test_codecs_import_only_formats_stubs_and_their_protocol():
    codecs = [name for name in MODULES if name.startswith("mqmeta.codec.")]
    assert "mqmeta.codec.rocketmq5" in codecs
    problems = [
        f"{name}:{line} imports {target}"
        for name in codecs
        for target, _, line in _imports(name, MODULES[name])
        if _ours(target) and not any(target == m or target.startswith(m + ".") for m in CODEC_MODULES)
    ]
    assert not problems, "a codec converts and nothing else:\n" + "\n".join(problems)


def test_no_part_imports_another_parts_private_name():
    problems = [
        f"{name}:{line} imports {target}.{imported}"
        for name, path in MODULES.items()
        for target, imported, line in _imports(name, path)
        if imported.startswith("_") and _ours(target) and _part(target) != _part(name)
    ]
    problems += [
        f"{name}:{line} imports private module {target}"
        for name, path in MODULES.items()
        for target, _, line in _imports(name, path)
        if _ours(target)
        and _part(target) != _part(name)
        and any(p.startswith("_") for p in target.split("."))
    ]
    assert not problems, "\n".join(problems)


def _names_a_test_module(target: str, imported: str) -> bool:
    dotted = f"{target}.{imported}" if imported else target
    parts = dotted.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:])


def test_no_test_module_imports_another():
    assert _names_a_test_module("tests.test_cluster", "topic_names")
    assert _names_a_test_module("tests", "test_cluster") and not _names_a_test_module("tests.support", "")
    test_modules = TEST_MODULES
    assert len(test_modules) > 20
    problems = [
        f"{path.relative_to(ROOT)}:{line} imports {target}" + (f".{imported}" if imported else "")
        for path in test_modules
        for target, imported, line in _imports(_module_name(path), path)
        if _names_a_test_module(target, imported)
    ]
    assert not problems, "move what test modules share to tests/support/:\n" + "\n".join(problems)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_cycle():
    cycles = _cycles(_edges())
    assert not cycles, "module cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_spark_executor_modules_import_no_grpc():
    code = (
        "import sys\n"
        + "".join(f"import {BASE}.{m}\n" for m in SPARK_EXECUTOR_MODULES)
        + "loaded = sorted(m for m in sys.modules if m == 'grpc' or m.startswith('grpc.'))\n"
        + "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_command_has_a_cli_module_with_add_parser_and_run():
    """The front door's convention (docs/design/rooms.md): the table names, per command, a
    module with top-level `add_parser` and `run`; every part above the base has its cli.py."""
    from mqmeta.cli import COMMANDS, PART_CLIS

    assert set(PART_CLIS) == set(COMMANDS)
    problems = []
    for command, module in PART_CLIS.items():
        name = _folder_name(module)
        if name not in MODULES:
            problems.append(f"{command}: no module {name}")
            continue
        defined = {n.name for n in TREES[MODULES[name]].body if isinstance(n, ast.FunctionDef)}
        problems += [f"{command}: {name} has no {f}()" for f in ("add_parser", "run") if f not in defined]
    problems += [f"{part}/ has no cli.py" for part in INSTALLED_PARTS if f"{part}.cli" not in MODULES]
    assert not problems, "\n".join(problems)
