"""The ``+experiment=NAME`` presets of conf/experiment/: each composes and validates."""

import pytest

from tests.helpers import REPO, make_config


def test_experiment_preset_applies():
    cfg = make_config(["+experiment=smoke"])
    assert cfg.total_steps == 8192 and cfg.env.num_envs == 16


@pytest.mark.parametrize(
    "name", sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
)
def test_experiment_presets_compose_and_validate(name):
    cfg = make_config([f"+experiment={name}"])
    batch = cfg.env.num_envs * cfg.algo.num_steps
    assert cfg.total_steps >= batch and batch % cfg.algo.num_minibatches == 0


def test_maniskill_gpu_preset_uses_maniskill_baseline_settings():
    cfg = make_config(["+experiment=maniskill_pushcube_gpu"])
    assert (cfg.env.name, cfg.env.id, cfg.sim.name) == ("maniskill", "PushCube-v1", "gpu")
    assert (
        cfg.env.num_envs,
        cfg.algo.num_steps,
        cfg.algo.update_epochs,
        cfg.algo.num_minibatches,
    ) == (2048, 20, 8, 32)
    assert (cfg.algo.gamma, cfg.algo.gae_lambda, cfg.algo.norm_obs) == (0.8, 0.9, False)
