"""Config composition and validation: bad input fails before any work, naming the key."""

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from rlrec.checks import ConfigError
from rlrec.config import validate
from rlrec.envs.builtin import BuiltinEnvConfig
from rlrec.record.settings import Trigger
from rlrec.run import budget
from tests.helpers import REPO, compose_cfg, make_config

CONF = Path(REPO) / "conf"


def test_default_config_resolves_to_dataclasses():
    cfg = make_config()
    assert isinstance(cfg.env, BuiltinEnvConfig)
    assert cfg.recorder.trigger is Trigger.cubic
    assert cfg.eval_env.recorder.trigger is Trigger.eval
    assert cfg.sim.device == "cpu" and cfg.algo.name == "ppo"


@pytest.mark.parametrize(
    "override, error, words",
    [
        ("env=nope", MissingConfigException, ["env/nope", "builtin"]),
        ("env.foo=1", ConfigCompositionException, ["env.foo"]),
        ("env.num_envs=abc", ConfigCompositionException, ["env.num_envs", "to Integer"]),
    ],
)
def test_composing_refuses_an_unknown_option_key_or_type(override, error, words):
    with pytest.raises(error) as e:
        compose_cfg([override])
    assert all(w in f"{e.value} {e.value.__cause__}" for w in words), e.value


@pytest.mark.parametrize(
    "override,allowed",
    [
        ("logger.name=stdout", ["tensorboard", "wandb", "none"]),
        ("logger.wandb_mode=sometimes", ["offline", "online", "disabled"]),
        ("sim.name=tpu", ["cpu", "gpu"]),
        ("algo.activation=gelu", ["tanh", "relu", "elu"]),
        ("algo.bootstrap_at=success", ["truncated", "done"]),
        ("algo.kl_check=step", ["epoch", "minibatch"]),
        ("algo.grad_clip=global", ["joint", "per_network"]),
        ("algo.init=xavier", ["orthogonal", "torch_default"]),
        ("recorder.on_error=ignore", ["warn", "raise"]),
        ("recorder.preset=warp", ["ultrafast", "veryslow"]),
        ("eval_env.recorder.trigger=sometimes", ["cubic", "eval", "none"]),
        ("env=gymnasium env.vectorization=threads", ["sync", "async"]),
        ("env=gymnasium env.async_context=fast", ["fork", "spawn", "forkserver"]),
        ("env=maniskill env.cpu_vectorization=threads", ["sync", "async"]),
        ("env=maniskill env.obs_mode=rgbd", ["state", "rgb", "rgb_state"]),
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


def _leaves(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


GROUPS = ("env", "sim", "eval_env", "recorder", "algo", "logger", "distributed", "report")


@pytest.mark.parametrize(
    "path",
    sorted(p for p in (CONF / g for g in GROUPS) for p in p.glob("*.yaml")),
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


# --------------------------------------------------------------------------- float fields, seeds


def _schemas():
    from rlrec import config as c
    from rlrec.envs.config import BACKENDS

    first = [c.Config, c.SimConfig, c.RecorderConfig, c.EvalEnvConfig, c.PPOConfig, c.LoggerConfig]
    return [*first, c.DistributedConfig, *BACKENDS.values()]


def test_every_float_field_has_its_range():
    """One generic check covers every float field; a new float field needs its range in
    its schema's FLOAT_RANGES (so the ranges cannot drift from the schemas)."""
    from rlrec.checks import field_types

    missing = [
        f"{cls.__name__}.{name}"
        for cls in _schemas()
        for name, hint, _ in field_types(cls)
        if hint is float and not any(name in vars(k).get("FLOAT_RANGES", {}) for k in cls.__mro__)
    ]
    assert not missing, f"float fields without a range in their FLOAT_RANGES: {missing}"
    assert len([1 for cls in _schemas() for _, h, _ in field_types(cls) if h is float]) >= 14


def _float_keys(obj, prefix=""):
    from dataclasses import fields, is_dataclass

    from rlrec.checks import field_types

    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            yield from _float_keys(value, f"{prefix}{f.name}.")
    for name, hint, _ in field_types(type(obj)):
        if hint is float:
            yield f"{prefix}{name}"


FLOAT_KEYS = sorted(_float_keys(make_config()))


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_float_field_refuses_non_finite_values(key, value):
    with pytest.raises(ConfigError) as e:
        make_config([f"{key}={value}"])
    assert f"{key}={value}" in str(e.value) and "finite number" in str(e.value)


def test_dataclasses_built_in_code_get_the_same_refusals():
    """A config built (or changed) in code, without Hydra: its closed choices and floats are
    refused by validation as while composing."""
    from rlrec.record.settings import RecorderConfig

    cfg = make_config()
    cfg.logger.name = "stdout"
    with pytest.raises(ConfigError, match=r"logger\.name='stdout'.*tensorboard, wandb, none"):
        validate(cfg)
    cfg = make_config()
    cfg.algo.learning_rate = float("nan")
    with pytest.raises(ConfigError, match=r"algo\.learning_rate=nan"):
        validate(cfg)
    with pytest.raises(ConfigError, match=r"rec\.fps=inf"):
        RecorderConfig(fps=float("inf")).check(1, "rec")


@pytest.mark.parametrize(
    "override, message",
    [
        ("env.num_envs=0", "a positive number"),
        ("eval_env.num_envs=-3", "a positive number"),
        ("total_steps=-1", "a positive number"),
        ("algo.num_steps=0", "a positive number"),
        ("algo.update_epochs=0", "a positive number"),
        ("eval_env.every=0", "a positive number"),
        ("report.max_tiles=0", "a positive number"),
        ("algo.num_minibatches=3", "must divide env.num_envs * algo.num_steps"),
        ("resume=sometimes", "allowed values are auto, null"),
        ("algo.gamma=1.5", "a finite number in [0, 1]"),
        ("algo.adam_eps=0", "a finite number > 0"),
        ("algo.adam_eps=-1e-8", "a finite number > 0"),
        ("algo.vf_coef=-0.5", "a finite number >= 0"),
        ("algo.ent_coef=-1e-3", "a finite number >= 0"),
        ("algo.reward_scale=0", "a finite number > 0"),
        ("algo.init_log_std=25", "a finite number in [-20, 20]"),
        ("algo.gae_lambda=1.01", "a finite number in [0, 1]"),
        ("env.goal_radius=0", "a finite number > 0"),
        ("recorder.fps=-2", "a finite number > 0 or null"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError) as e:
        make_config([override])
    assert str(e.value).startswith(override.split("=")[0] + "=") and message in str(e.value)


def test_range_bounds():
    """A closed bound is allowed, a value just past it is not."""
    cfg = make_config(
        ["algo.vf_coef=0", "algo.ent_coef=0", "algo.init_log_std=-20", "algo.target_kl=null"]
    )
    assert cfg.algo.vf_coef == 0 and cfg.algo.target_kl is None
    for override in ("algo.vf_coef=-1e-9", "algo.ent_coef=-1e-9", "algo.init_log_std=-20.5"):
        with pytest.raises(ConfigError, match=override.split("=")[0]):
            make_config([override])


def test_seed_range_counts_every_env_of_the_stack():
    """Env i is seeded seed + i: the last env's seed must still be 32-bit."""
    top = 2**32 - 64  # 64 envs: seeds top .. 2**32 - 1
    assert make_config([f"seed={top}", "env.num_envs=64"]).seed == top
    assert make_config(["seed=0"]).seed == 0
    with pytest.raises(ConfigError, match=r"seed=4294967233 is invalid: .*\[0, 4294967232\]"):
        make_config([f"seed={top + 1}", "env.num_envs=64"])
    with pytest.raises(ConfigError, match=r"eval_env\.seed=-3"):
        make_config(["eval_env.seed=-3"])


# --------------------------------------------------------------------------- keys


def test_sim_device_is_cpu_or_cuda():
    """Parsed with torch.device; cpu, cuda and cuda:N pass (whether that GPU exists is
    resolve_device's question, when the run starts), any other device is refused."""
    for device in ("cpu", "cuda", "cuda:0", "cuda:3"):
        assert make_config([f"sim.device={device}"]).sim.device == device
    for device in ("nonsense", "meta", "cpu:1", "mps", "cuda:-1", "CUDA"):
        with pytest.raises(ConfigError) as e:
            make_config([f"sim.device={device}"])
        assert str(e.value).startswith("sim.device=") and "cpu, cuda, cuda:N" in str(e.value)


def test_plus_adds_presets_and_free_form_kwargs_but_no_unknown_key():
    """+experiment=NAME (a defaults entry) and +env.kwargs.KEY (a free-form dict) still work."""
    assert make_config(["+experiment=smoke"]).total_steps == 8192
    cfg = make_config(["env=gymnasium", "env.id=Pendulum-v1", "+env.kwargs.g=9.81"])
    assert cfg.env.kwargs == {"g": 9.81}
    with pytest.raises(ConfigError, match=r"^evn is not a config key"):
        make_config(["+evn=gymnasium"])
    with pytest.raises(ConfigError, match=r"^env\.foo is not a config key.*BuiltinEnvConfig"):
        make_config(["+env.foo=1"])


# --------------------------------------------------------------------------- memory estimate


def test_rollout_and_model_estimates_and_where_they_live():
    cfg = make_config(["env.num_envs=10", "algo.num_steps=20", "algo.num_minibatches=2"])
    cfg.algo.hidden_sizes = [3, 5]
    needs = {n.what: n for n in budget.estimate(cfg)}
    assert needs["the rollout storage"].bytes == 10 * 20 * 8 * 4
    # actor and critic [1, 3, 5, 1]: (1*3+3) + (3*5+5) + (5*1+1) = 32 parameters each, 4 copies
    assert needs["the model with its gradients and Adam state"].bytes == 2 * 32 * 4 * 4
    assert needs["the activations of one update minibatch"].bytes == 100 * 8 * 2 * 4
    queue = needs["the frame buffers of the recorder queue"]
    assert queue.bytes == 64 * 128 * 128 * 3 and queue.where == "host"
    assert "recorder.queue_size=64" in queue.keys
    both = make_config(["env.obs_mode=rgb", "algo.encoder=cnn", "recorder.view=both"])
    queue = {n.what: n for n in budget.estimate(both)}["the frame buffers of the recorder queue"]
    assert queue.bytes == 64 * 2 * 128 * 128 * 3  # the render and the obs tile side by side
    with_gpu = {n.what: n.where for n in budget.estimate(cfg, on_gpu=True)}
    assert with_gpu["the rollout storage"] == "device"
    assert with_gpu["the frame buffers of the recorder queue"] == "host"  # pinned host buffers
    assert {n.where for n in budget.estimate(cfg)} == {"host"}


def _model_and_batch(cfg, rows):
    """The model a run of ``cfg`` builds, for a one-float state and one action, and a batch."""
    import gymnasium as gym
    import numpy as np
    import torch

    from rlrec.ppo.agent import ActorCritic

    image = cfg.env.obs_image()
    state = gym.spaces.Box(-1, 1, (1,), np.float32)
    obs, space = torch.randn(rows, 1), state
    if image is not None:
        space = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, image, np.uint8)})
        obs = {"rgb": torch.randint(0, 256, (rows, *image), dtype=torch.uint8)}
        if cfg.env.obs_mode == "rgb_state":
            space.spaces["state"], obs["state"] = state, torch.randn(rows, 1)
    a = cfg.algo
    model = ActorCritic(space, gym.spaces.Discrete(1), list(a.hidden_sizes), encoder=a.encoder)
    return model, obs


PIXELS = [
    [],
    ["env.obs_mode=rgb_state", "algo.encoder=cnn"],
    ["env.obs_mode=rgb", "algo.encoder=cnn", "env.obs_width=40", "env.obs_height=52"],
    ["env.obs_mode=rgb_state", "env.obs_width=32", "env.obs_height=32"],  # algo.encoder=mlp
]


@pytest.mark.parametrize("args", PIXELS)
def test_the_estimate_counts_the_model_and_what_autograd_keeps(args):
    """The model's parameters as the model has them (NatureCNN's included); an update minibatch's
    activations at most what autograd keeps of a batch and within 20% of it (what it leaves out:
    the inputs and the heads' outputs, a few floats per row)."""
    import torch

    cfg = make_config([*args, "algo.hidden_sizes=[7,5]", "algo.num_minibatches=1"])
    needs = {n.what: n for n in budget.estimate(cfg)}
    rows = cfg.env.num_envs * cfg.algo.num_steps
    model, obs = _model_and_batch(cfg, rows)
    params = sum(p.numel() for p in model.parameters())
    assert needs["the model with its gradients and Adam state"].bytes == params * 4 * 4
    ours = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in ours:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.evaluate(obs, torch.zeros(rows))
    counted = needs["the activations of one update minibatch"].bytes
    assert 0.8 * sum(kept.values()) <= counted <= sum(kept.values())


def test_cuda_graphs_count_their_input_copies_and_the_bootstrap_pass():
    """algo.compile on CUDA: the graphs' copies of their inputs (the policy step's observation and
    noise, one minibatch) and the eager bootstrap pass beside the graphs; eager or on the CPU,
    the bootstrap pass runs in the action step's memory and nothing is copied."""
    args = ["env.obs_mode=rgb_state", "algo.encoder=cnn", "env.num_envs=100", "algo.num_steps=8"]
    cfg = make_config([*args, "algo.num_minibatches=4", "algo.compile=true"])
    needs = {n.what: n for n in budget.estimate(cfg, on_gpu=True)}
    obs = 64 * 64 * 3 + 4  # the image and a one-float state
    assert needs["the CUDA-graph copies of the policy step's inputs"].bytes == 100 * (obs + 4)
    assert needs["the CUDA-graph copies of one minibatch"].bytes == 200 * (obs + 5 * 4)
    step = needs["the activations of one action step (and of its bootstrap pass)"].bytes
    bootstrap = needs["the activations of the bootstrap pass (eager, beside the CUDA graphs)"]
    assert step > bootstrap.bytes > step * 0.9  # the encoder dominates; the critic alone
    eager = {n.what for n in budget.estimate(make_config(args), on_gpu=True)}
    on_cpu = {n.what for n in budget.estimate(cfg)}
    assert not any("CUDA-graph" in w or "bootstrap pass (eager" in w for w in eager | on_cpu)


def test_host_memory_is_the_machine_s():
    have, source = budget.host_memory()
    total = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    assert have is not None and 0 < have <= total and source
