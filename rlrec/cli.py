"""The ``train.py`` / ``rlrec-train`` entry point: Hydra composes, rlrec.runner runs."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from rlrec.config import register_configs
from rlrec.preflight import check_argv

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")

# A per-process id for run dir names: two runs started in the same second never share a dir.
_UID = f"{os.getpid()}{secrets.token_hex(2)}"
if not OmegaConf.has_resolver("rlrec_uid"):
    OmegaConf.register_new_resolver("rlrec_uid", lambda: _UID, use_cache=True)
register_configs()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _hydra_main(cfg: DictConfig) -> Optional[float]:
    """Trains (or evaluates) and returns the final eval return, for sweepers such as Optuna."""
    from rlrec.runner import run_from_hydra

    return run_from_hydra(cfg)


def main() -> None:
    """Checks the command line for launcher/sweeper plugins that are not installed (naming the
    extra), then hands over to Hydra."""
    check_argv()
    _hydra_main()


if __name__ == "__main__":
    main()
