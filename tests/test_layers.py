"""The package's layers import downward only, with no cycle (docs/architecture.md, "Layers").

Every ``import`` of an rlrec module, at module level or inside a function, is an edge; each module
has a layer, and an edge may only point to a lower layer or stay inside its own package.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Set

PACKAGE = Path(__file__).resolve().parent.parent / "rlrec"

# lowest first; a module may import only modules of a lower layer (or of its own package)
LAYERS = [
    ["rlrec.config"],
    ["rlrec.rundir"],  # the run-dir lock: Preflight claims the dir, preempt asks whom it replaced
    ["rlrec.distributed"],  # the process group: PPO all-reduces, Preflight agrees on the run dir
    [
        "rlrec.envs",
        "rlrec.ppo",
        "rlrec.preflight",
        "rlrec.checkpoint",
        "rlrec.preempt",
        "rlrec.budget",
    ],
    ["rlrec.record", "rlrec.logger", "rlrec.testing"],
    ["rlrec.stack"],
    ["rlrec.evaluation"],
    ["rlrec.runner", "rlrec.sweep"],
    ["rlrec.cli"],
    ["rlrec"],  # the package's own __init__ may name anything
]


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    for rank, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return rank
    raise AssertionError(f"{module} has no layer in tests/test_layers.py: give it one")


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _imports() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module(path)
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t.startswith("rlrec.") or t == "rlrec")
    modules = set(graph)
    # "from rlrec.record import Recorder" names a module and an attribute: keep the module
    return {m: {t for t in e if t in modules} - {m} for m, e in graph.items()}


def test_every_import_points_down_a_layer():
    wrong = []
    for module, targets in _imports().items():
        for target in targets:
            if target == "rlrec" or (_package(target) == _package(module) and module != "rlrec"):
                continue
            if _layer(target) >= _layer(module):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle():
    graph = _imports()
    state: Dict[str, int] = {}
    cycle: list = []

    def visit(node: str, path: list) -> bool:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                cycle.extend(path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt])
                return True
            if state.get(nxt) is None and visit(nxt, path + [node]):
                return True
        state[node] = 2
        return False

    for node in sorted(graph):
        if state.get(node) is None and visit(node, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_config_knows_nothing_above_it():
    assert _imports()["rlrec.config"] == set()
