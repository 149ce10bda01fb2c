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
    # value checks shared by every component's settings (plain Python), the names of a run dir's
    # files (rlrec.layout); the two folders' __init__ import nothing
    ["rlrec.checks", "rlrec.layout", "rlrec.run", "rlrec.train"],
    ["rlrec.onnx_policy"],  # an export's ONNX policy with onnxruntime and numpy alone
    ["rlrec.obs"],  # what an observation is (a tensor, or a pixel dict), for envs and the policy
    ["rlrec.files"],  # one temporary-name scheme, atomic writes, one directory probe
    ["rlrec.record"],  # the recorder: drops into any loop (tests/record/test_portable.py)
    ["rlrec.distributed"],  # the process group: PPO all-reduces, Preflight agrees on the run dir
    # the run report reads a run dir's files (the recorder's formats), nothing of the loop
    ["rlrec.envs", "rlrec.ppo", "rlrec.report"],
    ["rlrec.record.wrappers", "rlrec.testing"],  # the drop-ins wrap other frameworks' envs
    ["rlrec.config"],  # the run's config, assembled from the components' schemas
    # rlrec/train/, the loop and what it owns: below rlrec/run/, and knows nothing of it
    [
        "rlrec.train.checkpoint",
        "rlrec.train.divergence",
        "rlrec.train.logger",
        "rlrec.train.timeline",
    ],
    # a run's policy exported (checkpoint -> TorchScript/ONNX); eval_only reads an export
    ["rlrec.train.stack", "rlrec.export"],
    ["rlrec.train.evaluation", "rlrec.train.resume"],
    ["rlrec.train.runner"],
    # rlrec/run/, the process around a run. The run-dir lock: Preflight claims the dir, preempt
    # asks whom it replaced
    ["rlrec.run.rundir"],
    # the memory estimate: preflight.refuse_before_work refuses what cannot fit
    ["rlrec.run.budget"],
    ["rlrec.run.preflight", "rlrec.run.preempt"],
    ["rlrec.run.sweep"],
    ["rlrec.run.cli"],  # makes the stop flag and hands it to the runner
    ["rlrec.run.replay"],  # re-runs an evaluation of a run: builds its config as the CLI does
    # the export's closed-loop check (the run's eval, as replay builds it) and its command
    ["rlrec.export.verify"],
    ["rlrec.export.__main__", "rlrec.dataset"],  # a run's eval episodes as a LeRobot dataset
    ["rlrec"],  # the package's own __init__ may name anything
]


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    for rank, names in enumerate(LAYERS):
        if module in names:
            return rank
    # the longest name that contains it: rlrec.record.wrappers.gymnasium is rlrec.record.wrappers'
    found = [(len(n), rank) for rank, names in enumerate(LAYERS) for n in names
             if module.startswith(n + ".")]  # fmt: skip
    if found:
        return max(found)[1]
    raise AssertionError(f"{module} has no layer in tests/test_layers.py: give it one")


def _package(module: str) -> str:
    parts = module.split(".")
    # rlrec.run, rlrec.train and rlrec.export hold modules of several layers: each module is its
    # own unit; the recorder's wrappers sit above its core (which must not import them)
    if parts[1:3] == ["record", "wrappers"]:
        return "rlrec.record.wrappers"
    return ".".join(parts[:3] if parts[1:2] in (["run"], ["train"], ["export"]) else parts[:2])


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
    # "from rlrec.record import Recorder" names a module and an attribute: keep the module;
    # "from rlrec.run import preempt" names a package and its module: keep the module only
    graph = {m: {t for t in e if t in modules} - {m} for m, e in graph.items()}
    return {
        m: {t for t in e if not any(o.startswith(t + ".") for o in e)} for m, e in graph.items()
    }


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
    """The run's config assembles the components' schemas and knows nothing of the run."""
    above = {t for t in _imports()["rlrec.config"] if _layer(t) >= _layer("rlrec.config")}
    assert not above, above
