"""The size figures of rlrec/ (issue 52) for the working tree, or a revision read with git show:

    python scripts/code_size.py [REV]

Lines; code lines (a token that is not a comment or a docstring), also after ``ruff format`` of a
copy with every ``# fmt: skip`` removed; code tokens (less comments, docstrings and layout); then
the ``# fmt: skip`` sites, the functions over 60 lines, the modules and folders importing each
other, the clip engine's class, the runner, layout names spelled outside rlrec/layout.py, the
ConfigError sites and whether train/ imports run/.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

REPO = Path(__file__).resolve().parent.parent
LAYOUT = ["metrics.jsonl", "checkpoints", "videos", "tensorboard", "eval_episodes.jsonl"]
LAYOUT_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
SKIP = LAYOUT_TOKENS | {tokenize.ENDMARKER, tokenize.ENCODING}
FMT_SKIP = re.compile(r"[ \t]*# fmt: skip")
LONG = 60  # a function longer than this many lines


def sources(rev: str | None) -> Dict[str, str]:
    if rev is None:
        return {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "rlrec").rglob("*.py")}

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout

    names = git("ls-tree", "-r", "--name-only", rev, "--", "rlrec").split()
    return {n: git("show", f"{rev}:{n}") for n in names if n.endswith(".py")}


def docstrings(tree: ast.AST) -> Iterator[ast.Expr]:
    """The first statements of the module, classes and functions that are strings."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    yield first


def code_lines(src: str) -> int:
    docs = {i for d in docstrings(ast.parse(src)) for i in range(d.lineno, d.end_lineno + 1)}
    toks = tokenize.generate_tokens(io.StringIO(src).readline)
    return len(
        {i for t in toks if t.type not in SKIP for i in range(t.start[0], t.end[0] + 1)} - docs
    )


def code_tokens(src: str) -> int:
    """Python's tokens of ``src`` less comments, docstrings, NEWLINE/NL/INDENT/DEDENT/ENDMARKER."""
    spans = [
        ((d.lineno, d.col_offset), (d.end_lineno, d.end_col_offset))
        for d in docstrings(ast.parse(src))
    ]
    return sum(
        1
        for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type not in SKIP and not any(a <= tok.start < b for a, b in spans)
    )


def formatted_code_lines(files: Dict[str, str]) -> int:
    """Code lines of a copy of ``files`` without its ``# fmt: skip``, after ``ruff format``."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in files.items():
            (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / name).write_text(FMT_SKIP.sub("", src))
        config = ["--config", str(REPO / "pyproject.toml")]
        subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--quiet", *config, tmp], check=True
        )
        return sum(code_lines((Path(tmp) / name).read_text()) for name in files)


def functions(src: str) -> Iterator[Tuple[str, int]]:
    """(qualified name, lines from ``def`` to its end) of every function of ``src``."""

    def visit(node: ast.AST, prefix: str) -> Iterator[Tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not isinstance(child, ast.ClassDef):
                    yield prefix + child.name, child.end_lineno - child.lineno + 1
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    return visit(ast.parse(src), "")


def module_of(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(files: Dict[str, str]) -> Dict[str, Set[str]]:
    """Module -> the rlrec modules it imports, at module level or inside a function."""
    modules = {module_of(f): f for f in files}
    graph: Dict[str, Set[str]] = {}
    for module, path in modules.items():
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        targets: Set[str] = set()
        for node in ast.walk(ast.parse(files[path])):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                base = ".".join(p for p in (base, node.module or "") if p)
                # "from rlrec.train import checkpoint" imports the module rlrec.train.checkpoint
                subs = {f"{base}.{a.name}" for a in node.names} & modules.keys()
                targets.update(subs or {base})
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def folders(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """The graph between rlrec's folders (rlrec/train/...) and its top-level modules."""

    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    out: Dict[str, Set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(unit(module), set()).update(unit(t) for t in targets)
    return {u: t - {u, "rlrec"} for u, t in out.items()}


def mutual(graph: Dict[str, Set[str]]) -> List[Tuple[str, str]]:
    return sorted(
        (a, b) for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, ())
    )


def main() -> None:
    rev = sys.argv[1] if len(sys.argv) > 1 else None
    files = sources(rev)
    print(f"rlrec/ at {rev or 'the working tree'}: {len(files)} files")
    print(f"  lines {sum(s.count(chr(10)) for s in files.values()):,}")
    print(f"  code lines {sum(code_lines(s) for s in files.values()):,}")
    print(f"  code lines after ruff format without '# fmt: skip' {formatted_code_lines(files):,}")
    print(f"  code tokens {sum(code_tokens(s) for s in files.values()):,}")
    print(f"  '# fmt: skip' sites {sum(len(FMT_SKIP.findall(s)) for s in files.values())}")
    long = [(k, n, f) for f, s in files.items() for n, k in functions(s) if k > LONG]
    print(f"  functions over {LONG} lines: {len(long)}")
    for length, name, f in sorted(long, reverse=True):
        print(f"    {length:4d}  {name}  ({f})")
    graph = imports(files)
    for what, pairs in (("modules", mutual(graph)), ("folders", mutual(folders(graph)))):
        print(f"  {what} importing each other: {len(pairs)} {[' <-> '.join(p) for p in pairs]}")
    engine = ast.parse(files["rlrec/record/engine.py"])
    cls = next(n for n in engine.body if isinstance(n, ast.ClassDef) and n.name == "ClipEngine")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    init = next(n for n in methods if n.name == "__init__")
    params = len(init.args.args) - 1 + len(init.args.kwonlyargs)
    size = f"{cls.end_lineno - cls.lineno + 1} lines, {len(methods)} methods"
    print(f"  ClipEngine: {size}, {params} constructor parameters")
    runner = files.get("rlrec/train/runner.py", "")
    print(f"  rlrec/train/runner.py: {runner.count(chr(10))} lines")
    for name in LAYOUT:
        where = [f for f, s in files.items() if f'"{name}"' in s and not f.endswith("layout.py")]
        print(f"  {name!r} spelled in {len(where)} modules")
    sites = sum(len(re.findall(r"raise ConfigError\(", s)) for s in files.values())
    print(f"  raise ConfigError sites: {sites}")
    imports_run = re.compile(r"^\s*(from rlrec\.run|import rlrec\.run|from rlrec import run)", re.M)
    up = [f for f, s in files.items() if f.startswith("rlrec/train/") and imports_run.search(s)]
    print(f"  train/ modules importing run/: {len(up)} {up}")


if __name__ == "__main__":
    main()
