"""The size figures of rlrec/ (issue "Smaller and plainer"), for the working tree or a revision:

    python scripts/code_size.py            # the working tree
    python scripts/code_size.py c084cb2    # a revision (read with git show, nothing checked out)

Lines: every line of rlrec/*.py; code lines: those with a token that is not a comment, a docstring
or blank. Then the clip engine's class (lines, methods, constructor parameters), the runner's
module, the layout names spelled outside rlrec/layout.py, the ConfigError sites, and whether
train/ imports run/.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import Dict

REPO = Path(__file__).resolve().parent.parent
LAYOUT = ["metrics.jsonl", "checkpoints", "videos", "tensorboard", "eval_episodes.jsonl"]


def sources(rev: str | None) -> Dict[str, str]:
    if rev is None:
        return {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "rlrec").rglob("*.py")}
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "--", "rlrec"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        n: subprocess.run(["git", "show", f"{rev}:{n}"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout
        for n in names if n.endswith(".py")
    }  # fmt: skip


def code_lines(src: str) -> int:
    docs = set()
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None),
                                                          ast.Constant):  # fmt: skip
                if isinstance(first.value.value, str):
                    docs.update(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}  # fmt: skip
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docs)


def main() -> None:
    rev = sys.argv[1] if len(sys.argv) > 1 else None
    files = sources(rev)
    print(f"rlrec/ at {rev or 'the working tree'}: {len(files)} files")
    print(f"  lines {sum(s.count(chr(10)) for s in files.values()):,}")
    print(f"  code lines {sum(code_lines(s) for s in files.values()):,}")
    engine = ast.parse(files["rlrec/record/engine.py"])
    cls = next(n for n in engine.body if isinstance(n, ast.ClassDef) and n.name == "ClipEngine")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    init = next(n for n in methods if n.name == "__init__")
    params = len(init.args.args) - 1 + len(init.args.kwonlyargs)
    print(f"  ClipEngine: {cls.end_lineno - cls.lineno + 1} lines, {len(methods)} methods, "
          f"{params} constructor parameters")  # fmt: skip
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
