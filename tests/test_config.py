"""Config composition and validation: bad input fails before any work, naming the key."""

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from tests.helpers import compose_cfg, make_config
from rlrec.config import BuiltinEnvConfig, ConfigError, Trigger


def test_default_config_resolves_to_dataclasses():
    cfg = make_config()
    assert isinstance(cfg.env, BuiltinEnvConfig)
    assert cfg.recorder.trigger is Trigger.cubic
    assert cfg.eval_env.recorder.trigger is Trigger.eval
    assert cfg.sim.device == "cpu" and cfg.algo.name == "ppo"


def test_experiment_preset_applies():
    cfg = make_config(["+experiment=smoke"])
    assert cfg.total_steps == 8192 and cfg.env.num_envs == 16


def test_unknown_group_option_lists_allowed():
    with pytest.raises(MissingConfigException) as e:
        compose_cfg(["env=nope"])
    assert "env/nope" in str(e.value) and "builtin" in str(e.value)


def test_unknown_key_is_named():
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg(["env.foo=1"])
    assert "env.foo" in str(e.value)


def test_wrong_type_is_named():
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg(["env.num_envs=abc"])
    assert "env.num_envs" in str(e.value)
    assert "could not be converted to Integer" in str(e.value.__cause__)


@pytest.mark.parametrize(
    "override,key",
    [
        ("env.num_envs=0", "env.num_envs"),
        ("eval_env.num_envs=0", "eval_env.num_envs"),
        ("eval_env.num_envs=-3", "eval_env.num_envs"),
        ("total_steps=-1", "total_steps"),
        ("algo.num_steps=0", "algo.num_steps"),
        ("algo.update_epochs=0", "algo.update_epochs"),
        ("eval_env.every=0", "eval_env.every"),
        ("algo.num_minibatches=3", "algo.num_minibatches"),
        ("algo.gamma=1.5", "algo.gamma"),
        ("resume=sometimes", "resume"),
        ("logger.name=stdout", "logger.name"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        make_config([override])
    assert key in str(e.value)


def test_choice_errors_list_allowed_values():
    with pytest.raises(ConfigError) as e:
        make_config(["logger.name=stdout"])
    assert "tensorboard" in str(e.value) and "wandb" in str(e.value)
