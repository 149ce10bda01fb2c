"""The recorder drops into any loop: ``import rlrec.record`` loads no config system, no env
library and none of rlrec's config or env adapters (only the wrappers, on first use, import their
framework)."""

from __future__ import annotations

import json

from tests.record.recutil import python_c

FORBIDDEN = ("hydra", "omegaconf", "gymnasium", "rlrec.config", "rlrec.envs")


def test_import_rlrec_record_loads_no_config_system_and_no_env_library():
    code = "import json, sys, rlrec.record; print(json.dumps(sorted(sys.modules)))"
    stdout = python_c(code)
    loaded = json.loads(stdout)
    found = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert not found, f"import rlrec.record loaded {found}"


def test_the_wrappers_are_named_by_rlrec_record_and_imported_on_first_use():
    code = (
        "import sys, rlrec.record; "
        "assert 'rlrec.record.wrappers.gymnasium' not in sys.modules; "
        "print(rlrec.record.RecordVectorVideo.__module__, rlrec.record.Recorder.__module__)"
    )
    stdout = python_c(code)
    assert stdout.split() == [
        "rlrec.record.wrappers.gymnasium",
        "rlrec.record.wrappers.adapter",
    ]


def test_the_gymnasium_drop_in_loads_no_config_system():
    """``RecordVectorVideo`` is used in plain Gymnasium loops: neither Hydra nor OmegaConf."""
    code = "import json, sys, rlrec.record.wrappers.gymnasium; print(json.dumps(list(sys.modules)))"
    loaded = json.loads(python_c(code))
    found = [m for m in loaded if m.split(".")[0] in ("hydra", "omegaconf")]
    assert not found, f"import rlrec.record.wrappers.gymnasium loaded {found}"
