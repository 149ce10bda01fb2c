"""The ``bench`` extra installs everything the benchmarks under scripts/ import."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict, Set

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# what the benchmarks need without importing it by name (module: distribution): Gymnasium's
# vector RecordVideo encodes with moviepy (gymnasium[other]), CartPole's rgb_array render draws
# with pygame (gymnasium[classic-control]; pygame-ce since Gymnasium 1.3), bench_mujoco.py's
# envs are MuJoCo's (gymnasium[mujoco])
RUNTIME = {"moviepy": ("moviepy",), "pygame": ("pygame", "pygame-ce"), "mujoco": ("mujoco",)}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def bench_modules() -> Set[str]:
    """The top-level third-party modules the scripts/bench_*.py files import."""
    modules: Set[str] = set()
    scripts = sorted((ROOT / "scripts").glob("bench_*.py"))
    assert scripts
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    local = {"rlrec", "tests", "__future__", "benchlib"}  # scripts/benchlib.py
    return {m for m in modules - local if m not in sys.stdlib_module_names}


def installed_by(extra: str) -> Set[str]:
    """The distributions ``pip install '.[extra]'`` installs: rlrec's dependencies and the
    extra's, with the extras they name, followed through the installed packages' metadata."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: Dict[str, list] = project["optional-dependencies"]
    todo = [Requirement(r) for r in project["dependencies"] + extras[extra]]
    seen: Set[tuple] = set()
    out: Set[str] = set()
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        key = (name, tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        if name == "rlrec":  # rlrec[other,extras]: those extras' requirements
            todo += [Requirement(r) for e in req.extras for r in extras[e]]
            continue
        out.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            dep = Requirement(line)
            wanted = [""] + sorted(req.extras)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(dep)
    return out


def test_bench_extra_installs_what_the_benchmarks_import():
    provided = installed_by("bench")
    missing = [f"{m} (any of {d})" for m, d in RUNTIME.items() if not set(d) & provided]
    owners, unknown = None, []
    for module in sorted(bench_modules()):
        if _norm(module) in provided:  # the usual case: the module is named as its distribution
            continue
        if owners is None:  # slow: reads every installed distribution's file list
            owners = metadata.packages_distributions()
        dists = {_norm(d) for d in owners.get(module, [])}
        if not dists:
            unknown.append(module)
        elif not dists & provided:
            missing.append(f"{module} (from {', '.join(sorted(dists))})")
    assert not missing, f"the bench extra does not install: {missing}"
    if unknown:
        pytest.skip(f"not installed here, so not checked: {unknown}")
