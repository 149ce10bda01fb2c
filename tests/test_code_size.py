"""scripts/code_size.py's measures on small sources: code tokens leave out comments, docstrings
and layout; functions are measured by name; modules that import each other are found."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "code_size", Path(__file__).resolve().parent.parent / "scripts" / "code_size.py"
)
code_size = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(code_size)

SRC = '''"""The module's docstring."""
# a comment
x = "a string, not a docstring"


class C:
    """The class's docstring."""

    def f(self, a):
        "The method's docstring."
        return a + 1  # a trailing comment
'''


def test_code_tokens_leave_out_comments_docstrings_and_layout():
    # x = "..." (3), class C : (3), def f ( self , a ) : (8), return a + 1 (4)
    assert code_size.code_tokens(SRC) == 18
    relaid = SRC.replace("return a + 1", "return (\n            a\n            + 1\n        )")
    assert code_size.code_tokens(relaid) == 18 + 2  # the parentheses alone
    assert code_size.code_tokens(SRC + "\n\n# more words\n") == 18
    assert code_size.code_tokens("def g():\n    x = 1\n") == 8  # a statement, not a docstring


def test_functions_and_mutual_imports():
    assert list(code_size.functions(SRC)) == [("C.f", 3)]
    files = {
        "rlrec/a.py": "from rlrec import b\n",
        "rlrec/b.py": "def f():\n    from . import a\n",
        "rlrec/c.py": "import rlrec.a\n",
    }
    assert code_size.mutual(code_size.imports(files)) == [("rlrec.a", "rlrec.b")]


def test_formatted_code_lines_count_without_fmt_skip():
    src = "x = [\n    1, 2]  # fmt: skip\ny = {'a':1}\n"  # ruff format joins x's two lines
    assert code_size.code_lines(src) == 3
    assert code_size.formatted_code_lines({"rlrec/m.py": src}) == 2
