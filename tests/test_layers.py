"""The package's layers import downward only, with no cycle (docs/architecture.md, "Layers"):
between its folders (and top-level modules), which never import each other, and between the
modules inside a folder of several layers. Every ``import`` of an rlrec module, at module level or
inside a function, is an edge. No class name is defined twice in the package."""

from __future__ import annotations

import ast
import graphlib
from collections import Counter
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parent.parent / "rlrec"

# rlrec's folders and top-level modules, lowest first: each imports only lower ones
UNITS = [
    ["checks", "layout", "obs", "onnx_policy"],
    ["files", "distributed"],
    ["envs", "ppo"],
    ["record"],  # its core knows no env (tests/record/test_portable.py), its wrappers do
    ["report", "testing"],  # the report reads a run dir's files, nothing of the loop
    ["config"],  # the run's config, assembled from the components' schemas
    ["train"],  # the loop and what it owns, and the policy file format
    ["run"],  # the process around a run
    ["export", "dataset"],  # the commands on a run: export (its closed-loop check), dataset
]
# the modules of a folder of several layers, lowest first ("*": the rest); the modules of one
# layer, and those of the other folders, in any order but without a cycle
INSIDE = {
    "record": [["*"], ["wrappers"]],
    "train": [
        ["checkpoint", "divergence", "logger", "timeline"],
        ["policy", "stack"],
        ["evaluation", "resume"],
        ["runner"],
    ],
    "run": [
        ["process", "rundir", "budget", "preempt"],
        ["preflight"],
        ["sweep"],
        ["cli"],
        ["replay"],
    ],
    "export": [["__init__"], ["verify"], ["__main__"]],
}


def _sources() -> Dict[str, ast.AST]:
    """Each module's tree by its name after ``rlrec.`` (a package by its own name)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = ast.parse(
            path.read_text()
        )
    return out


def _imports() -> Dict[str, Set[str]]:
    trees = _sources()
    graph = {}
    for name, tree in trees.items():
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        # "from rlrec.record import Recorder": the package; "from rlrec.run import preempt": the
        # module alone
        found = {t.removeprefix("rlrec.") for t in found} & set(trees) - {name, ""}
        graph[name] = {t for t in found if not any(o.startswith(t + ".") for o in found)}
    return graph


def _rank(name: str, layers: List[List[str]]) -> int:
    ranks = [r for r, names in enumerate(layers) if name in names]
    ranks = ranks or [r for r, names in enumerate(layers) if "*" in names]
    assert ranks, f"{name} has no layer in tests/test_layers.py: give it one"
    return ranks[0]


def _unit(module: str) -> str:
    return module.split(".")[0]


def _inner(module: str) -> str:
    return (module.split(".") + ["__init__"])[1]


def _check(edges: Set[tuple], layers: List[List[str]]) -> None:
    both = sorted(f"{a} <-> {b}" for a, b in edges if a < b and (b, a) in edges)
    assert not both, "import each other:\n" + "\n".join(both)
    wrong = sorted(f"{a} -> {b}" for a, b in edges if _rank(b, layers) >= _rank(a, layers))
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_folders_import_downward_and_never_each_other():
    """The package's own __init__ may name anything."""
    edges = {(_unit(m), _unit(t)) for m, targets in _imports().items() if m for t in targets}
    _check({(a, b) for a, b in edges if a != b}, UNITS)


def test_modules_inside_a_folder_import_downward():
    for folder, layers in INSIDE.items():
        edges = {
            (_inner(m), _inner(t))
            for m, targets in _imports().items()
            for t in targets
            if _unit(m) == _unit(t) == folder
        }
        _check({(a, b) for a, b in edges if _rank(a, layers) != _rank(b, layers)}, layers)


def test_no_import_cycle():
    graphlib.TopologicalSorter(_imports()).prepare()  # CycleError naming the cycle


def test_no_class_name_is_defined_twice():
    names = Counter(
        n.name
        for tree in _sources().values()
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef)
    )
    assert not [n for n, k in names.items() if k > 1], sorted(n for n, k in names.items() if k > 1)
