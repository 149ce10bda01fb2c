"""Config composition and validation: bad input fails before any work, naming the key."""

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from rlrec.config import BuiltinEnvConfig, ConfigError, Trigger, validate
from tests.helpers import REPO, compose_cfg, make_config

CONF = Path(REPO) / "conf"


def test_default_config_resolves_to_dataclasses():
    cfg = make_config()
    assert isinstance(cfg.env, BuiltinEnvConfig)
    assert cfg.recorder.trigger is Trigger.cubic
    assert cfg.eval_env.recorder.trigger is Trigger.eval
    assert cfg.sim.device == "cpu" and cfg.algo.name == "ppo"


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
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        make_config([override])
    assert key in str(e.value)


@pytest.mark.parametrize(
    "override,allowed",
    [
        ("logger.name=stdout", ["tensorboard", "wandb", "none"]),
        ("logger.wandb_mode=sometimes", ["offline", "online", "disabled"]),
        ("sim.name=tpu", ["cpu", "gpu"]),
        ("algo.activation=gelu", ["tanh", "relu", "elu"]),
        ("recorder.on_error=ignore", ["warn", "raise"]),
        ("recorder.preset=warp", ["ultrafast", "veryslow"]),
        ("eval_env.recorder.trigger=sometimes", ["cubic", "eval", "none"]),
        ("env=gymnasium env.vectorization=threads", ["sync", "async"]),
        ("env=gymnasium env.async_context=fast", ["fork", "spawn", "forkserver"]),
        ("env=maniskill env.cpu_vectorization=threads", ["sync", "async"]),
        ("env=maniskill env.obs_mode=rgbd", ["state"]),
    ],
)
def test_closed_choices_are_refused_while_composing(override, allowed):
    """Every closed choice is an Enum: Hydra refuses a bad value while composing, naming the key
    and the allowed values (before any validation code runs)."""
    *group, item = override.split()
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg([*group, item])
    text = f"{e.value} {e.value.__cause__}"
    assert item.split("=")[0] in text, text
    for value in allowed:
        assert value in text, text


def test_choice_errors_list_allowed_values():
    """A dataclass built in code (no Hydra) gets the same refusal from validation."""
    cfg = make_config()
    cfg.logger.name = "stdout"
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert "logger.name" in str(e.value)
    assert "tensorboard" in str(e.value) and "wandb" in str(e.value)


def _leaves(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize(
    "path",
    sorted(
        p
        for p in (CONF / g for g in ("env", "sim", "eval_env", "recorder", "algo", "logger"))
        for p in p.glob("*.yaml")
    ),
)
def test_group_files_hold_no_default_twice(path):
    """The schema dataclasses hold every default once: a group file sets only the values its
    option changes, never one equal to the schema's own default."""
    data = OmegaConf.to_container(OmegaConf.load(path))
    data.pop("defaults", None)
    schema = OmegaConf.structured(_schema_of(path))
    for key, value in _leaves(data):
        default = OmegaConf.select(schema, key)
        default = OmegaConf.to_container(default) if OmegaConf.is_config(default) else default
        assert value != default, (
            f"{path.relative_to(CONF)}: {key}: {value!r} repeats the schema default"
        )


def _schema_of(path):
    text = path.read_text()
    line = next(x for x in text.splitlines() if "/schema/" in x)
    group, name = line.split("/schema/")[1].split("@")[0].split("/")
    from hydra.core.config_store import ConfigStore

    return ConfigStore.instance().load(f"schema/{group}/{name}.yaml").node


def test_schema_defaults_per_env_backend():
    """Per-backend defaults live in each backend's schema (not in YAML, where they drifted)."""
    assert make_config(["env=gymnasium"]).env.num_envs == 8
    assert make_config(["env=maniskill"]).env.num_envs == 8
    assert make_config(["env=genesis"]).env.num_envs == 16
    assert make_config([]).env.num_envs == 64
