"""The pieces the adapters share (rlrec/envs/base.py): the time limit, info conversion, importing
the user's code, rendering named sub-envs of a vector env; and what ``rlrec.envs`` imports
(which rlrec modules each layer may import: tests/test_layers.py)."""

import logging
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs import EpisodeClock, owned_info
from rlrec.envs.base import SubEnv, import_object, render_sub_envs

# --------------------------------------------------------------------------- EpisodeClock


def test_clock_truncates_at_the_limit_per_env_and_never_with_termination():
    clock = EpisodeClock(3, torch.device("cpu"))
    none = torch.zeros(3, dtype=torch.bool)
    assert clock.step(none, 3).tolist() == [False] * 3
    clock.reset(torch.tensor([1]))  # env 1 restarts its clock
    assert clock.step(none, 3).tolist() == [False] * 3
    trunc = clock.step(torch.tensor([True, False, False]), 3)  # env 0 terminates at the limit
    assert trunc.tolist() == [False, False, True] and trunc.dtype == torch.bool
    assert clock.elapsed.tolist() == [3, 2, 3]
    assert clock.step(none, 3).tolist() == [True, True, True]  # past the limit: still truncated
    clock.reset(torch.tensor([True, False, True]))  # a bool mask names envs too
    assert clock.elapsed.tolist() == [0, 3, 0]
    clock.reset()  # None: every env
    assert clock.elapsed.tolist() == [0, 0, 0]
    for _ in range(5):  # without a limit: it counts, and never truncates
        trunc = clock.step(none, None)
    assert not trunc.any() and trunc.dtype == torch.bool and clock.elapsed.tolist() == [5] * 3


# --------------------------------------------------------------------------- owned_info


def test_info_per_env_arrays_and_tensors_become_owned_tensors():
    """Plain tensors of their own on the device (a simulator's tensor subclass too), nested dicts
    kept; what is not a per-env numeric array dropped."""

    class Sub(torch.Tensor):
        pass

    arr, ten = np.array([1.5, 2.5, 3.5]), torch.tensor([1, 2, 3])
    sub = torch.tensor([1.0, 2.0, 3.0]).as_subclass(Sub)
    info = {
        "a": arr,
        "t": ten,
        "sub": sub,
        "scalar": 1.0,
        "zero_dim": torch.tensor(4.0),
        "other_len": np.zeros(2),
        "strings": np.array(["x", "y", "z"]),
        "objects": np.array([None, 1, "z"], dtype=object),
        "nested": {"b": np.array([True, False, True]), "c": "dropped"},
    }
    out = owned_info(info, 3, torch.device("cpu"))
    assert set(out) == {"a", "t", "sub", "nested"} and set(out["nested"]) == {"b"}
    assert type(out["sub"]) is torch.Tensor and out["sub"].data_ptr() != sub.data_ptr()
    assert out["a"].dtype == torch.float64 and out["a"].tolist() == [1.5, 2.5, 3.5]
    assert out["nested"]["b"].dtype == torch.bool
    arr[0], ten[0] = 100.0, 100  # the sources change: the converted values do not
    assert out["a"][0] == 1.5 and out["t"][0] == 1
    assert owned_info(None, 2, torch.device("cpu")) == {}


def test_info_success_fail_are_bool_and_is_success_is_success():
    cpu = torch.device("cpu")
    out = owned_info({"success": torch.tensor([1.0, 0.0]), "fail": np.array([0, 1])}, 2, cpu)
    assert out["success"].dtype == out["fail"].dtype == torch.bool
    assert out["success"].tolist() == [True, False] and out["fail"].tolist() == [False, True]
    gym_info = {"is_success": np.array([1.0, 0.0]), "_is_success": np.array([True, False])}
    out = owned_info(gym_info, 2, cpu)
    assert out["success"].tolist() == [True, False] and out["is_success"].dtype == torch.float64
    assert "_is_success" in out  # a gymnasium vector env's mask is kept by default ...
    out = owned_info(gym_info, 2, cpu, masks=False)
    assert set(out) == {"is_success", "success"}  # ... and dropped on request
    both = owned_info({"success": np.array([0, 0]), "is_success": np.array([1, 1])}, 2, cpu)
    assert both["success"].tolist() == [False, False]  # an env's own success wins


# --------------------------------------------------------------------------- import_object


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    (tmp_path / "rlrec_test_ok.py").write_text("class Env:\n    pass\n")
    (tmp_path / "rlrec_test_dep.py").write_text("import rlrec_test_no_such_dependency\n")
    (tmp_path / "rlrec_test_boom.py").write_text("raise RuntimeError('boom in user code')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("rlrec_test_ok", "rlrec_test_dep", "rlrec_test_boom"):
        sys.modules.pop(name, None)


def test_import_object_returns_modules_and_attributes(user_code):
    """A module, an attribute or a submodule; the errors of the user's module itself propagate;
    a refusal names the whole value when given."""
    assert import_object("rlrec_test_ok", "env.imports[0]").__name__ == "rlrec_test_ok"
    assert import_object("rlrec_test_ok.Env", "env._target_").__name__ == "Env"
    assert import_object("rlrec.envs.builtin.PointReach", "k").__name__ == "PointReach"
    with pytest.raises(RuntimeError, match="boom in user code"):
        import_object("rlrec_test_boom", "k")
    match = r"env.id='no_such_module_xyz:Foo-v0' cannot be imported: cannot import module 'no_such_"
    with pytest.raises(ConfigError, match=match):
        import_object("no_such_module_xyz", "env.id", "no_such_module_xyz:Foo-v0")


@pytest.mark.parametrize(
    "path, message",
    [
        (
            "no_such_module_xyz",
            r"k='no_such_module_xyz' cannot be imported: cannot import module 'no",
        ),
        ("no_such_module_xyz.Env", r"xyz.Env' cannot be imported: cannot import module 'no_such_"),
        ("rlrec_test_ok.Nope", r"module 'rlrec_test_ok' has no attribute 'Nope'"),
        ("rlrec.envs.no_such_sub.Env", r"module 'rlrec.envs' has no attribute 'no_such_sub'"),
        ("rlrec_test_ok.Env.nope", r"ok.Env.nope' cannot be imported: .*'Env' has no attribute 'n"),
        ("rlrec_test_dep.Env", r"module 'rlrec_test_dep' \(No module named 'rlrec_test_no_such_"),
        ("a..b", r"k='a..b' is invalid: .*invalid dotstring"),
        ("", r"k='' is invalid"),
    ],
)
def test_import_object_errors_name_the_key_and_what_failed(user_code, path, message, caplog):
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigError, match=message):
        import_object(path, "k")
    assert not [r for r in caplog.records if r.name.startswith("hydra")], "hydra logged it too"


# --------------------------------------------------------------------------- render_sub_envs


class Counting(gym.Env):
    """Frame pixel values: (its index, how many times it rendered so far)."""

    metadata = {"render_modes": ["rgb_array"]}
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, index):
        self.index, self.renders, self.render_mode = index, 0, "rgb_array"

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def render(self):
        self.renders += 1
        return np.full((2, 3, 3), (self.index, self.renders, 0), np.uint8)


def _counting(i):
    return SubEnv(Counting(i), i)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_only_the_named_sub_envs_render_in_the_order_asked(vectorization):
    fns = [lambda i=i: _counting(i) for i in range(3)]
    if vectorization == "sync":
        vec = gym.vector.SyncVectorEnv(fns)
    else:
        vec = gym.vector.AsyncVectorEnv(fns, context="fork")
    try:
        vec.reset()
        a = render_sub_envs(vec, [2, 0])
        assert a.dtype == torch.uint8 and a.shape == (2, 2, 3, 3)
        assert a[:, 0, 0, :2].tolist() == [[2, 1], [0, 1]]
        b = render_sub_envs(vec, [2, 2])  # the same env twice in one call
        assert b[:, 0, 0, 0].tolist() == [2, 2]
        c = render_sub_envs(vec, [1])
        assert c[0, 0, 0, :2].tolist() == [1, 1]  # env 1 never rendered before
        assert a[0, 0, 0, 1] == 1  # the frames handed out are owned: later renders leave them alone
    finally:
        vec.close()


# --------------------------------------------------------------------------- the package


def test_importing_rlrec_envs_imports_no_simulator_or_backend():
    code = textwrap.dedent(
        """
        import sys
        import rlrec.envs
        from rlrec.envs import AutoReset, EnvAdapter, EnvWrapper, as_env_index, make_adapter
        simulators = ("mani_skill", "sapien", "genesis", "pygame")
        loaded = [m for m in sys.modules if m.split(".")[0] in simulators
                  or m in ("rlrec.envs.builtin", "rlrec.envs.gymnasium", "rlrec.envs.maniskill",
                           "rlrec.envs.genesis", "rlrec.envs.genesis_tasks")
                  or m.startswith(("rlrec.record", "rlrec.train.stack", "rlrec.train.runner"))]
        assert not loaded, loaded
        assert sorted(rlrec.envs.__all__) == sorted(set(rlrec.envs.__all__))
        for name in rlrec.envs.__all__:
            getattr(rlrec.envs, name)
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_each_backend_is_its_module_its_schema_and_its_yaml():
    """The registry names each backend once; its schema carries the same name, the backend's
    module (rlrec.envs.<name>) builds it, and conf/env/<name>.yaml extends that schema."""
    from pathlib import Path

    from rlrec.envs import factory
    from rlrec.envs.config import BACKENDS

    conf = Path(__file__).resolve().parents[2] / "conf" / "env"
    for name, schema in BACKENDS.items():
        module = factory.backend_module(name)
        assert schema.name == name and module.__name__ == f"rlrec.envs.{name}"
        assert callable(module.make)
        assert f"/schema/env/{name}@_here_" in (conf / f"{name}.yaml").read_text()
    assert sorted(p.stem for p in conf.glob("*.yaml")) == sorted(BACKENDS)
