"""The recorder drops into any loop: ``import rlrec.record`` loads no config system, no env
library and none of rlrec's config or env adapters (only the wrappers, on first use, import their
framework)."""

from __future__ import annotations

import json

from tests.record.recutil import python_c

FORBIDDEN = ("hydra", "omegaconf", "gymnasium", "mani_skill", "sapien", "genesis", "rlrec.config")
FORBIDDEN += ("rlrec.envs", "rlrec.record.wrappers")


def loaded(code: str) -> list:
    """The modules loaded by ``code`` in a fresh interpreter that are of ``FORBIDDEN``."""
    modules = json.loads(
        python_c(f"import json, sys; {code}; print(json.dumps(list(sys.modules)))")
    )
    return [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


def test_import_rlrec_record_loads_no_config_system_and_no_env_library():
    assert loaded("import rlrec.record") == []


def test_the_wrappers_are_named_by_rlrec_record_and_imported_on_first_use():
    code = "import rlrec.record as r; print(r.RecordVectorVideo.__module__, r.Recorder.__module__)"
    assert python_c(code).split() == [
        "rlrec.record.wrappers.gymnasium",
        "rlrec.record.wrappers.adapter",
    ]
    # the Gymnasium drop-in is used in plain Gymnasium loops: neither Hydra nor OmegaConf
    found = loaded("import rlrec.record.wrappers.gymnasium")
    assert not [m for m in found if m.split(".")[0] in ("hydra", "omegaconf")], found
