"""Fixtures shared by every test module (tests/ mirrors rlrec/, as packages)."""

import os

os.environ.setdefault("PYTHONHASHSEED", "0")
