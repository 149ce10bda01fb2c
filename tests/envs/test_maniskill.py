"""env=maniskill against the real ManiSkill3 simulator (CPU sim, lavapipe Vulkan, small frames).

One adapter is shared per test class (the first render in a process costs seconds); every test
starts from a seeded full reset, so sharing does not couple them.
"""

import sys

import gymnasium as gym
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs.config import SimConfig
from rlrec.testing import EnvContract, sample_actions
from tests.envs.maniskill_util import SIZE, ms, pytestmark  # noqa: F401  (marks this module)
from tests.envs.maniskill_util import make_cfg as _cfg
from tests.envs.maniskill_util import make_env as _env

LIMIT = 8


def make_cfg(**over):
    return _cfg(**{"max_episode_steps": LIMIT, **over})


def make_env(num_envs=2, seed=None, sim="cpu", **over):
    return _env(num_envs, seed, sim, **{"max_episode_steps": LIMIT, **over})


class TestManiSkillCPUContract(EnvContract):
    num_envs = 2
    max_steps_to_truncation = LIMIT
    render_atol = 0.0  # lavapipe renders are pixel-deterministic

    def make_env(self, num_envs, seed=None):
        return make_env(num_envs, seed)

    @pytest.fixture(scope="class")
    def env(self):
        env = self.make_env(self.num_envs, seed=self.seed)
        yield env
        env.close()


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="sim=gpu needs CUDA and SAPIEN's PhysX GPU library "
    "(tools/device/gpu_check.py --parts physx_contract)",
)
class TestManiSkillGPUContract(TestManiSkillCPUContract):
    """The same contract on the batched physx_cuda env (GPU renders: compared with a small
    tolerance)."""

    num_envs = 4
    render_atol = 0.5

    def make_env(self, num_envs, seed=None):
        return make_env(num_envs, seed, sim="gpu")

    def test_each_sub_scene_gets_its_episode_seed(self, env):
        """What the batched sim keeps of the seed rule: sub-scene i's episode seed is s + i."""
        env.reset(seed=40)
        assert env.env._episode_seed.tolist() == [40 + i for i in range(self.num_envs)]

    def test_render_does_not_alias_the_camera_buffer(self, env):
        env.reset(seed=self.seed)
        a = env.render([0, 1])
        b = env.render([0, 1])
        assert a.data_ptr() != b.data_ptr() and torch.equal(a, b)


@pytest.fixture(scope="module")
def env():
    e = make_env(2, seed=0)
    yield e
    e.close()


def test_info_success_fail_and_spaces(env):
    obs, info = env.reset(seed=1)
    assert env.dt == pytest.approx(0.05)  # PushCube: control at 20 Hz
    assert env.single_observation_space.shape == obs.shape[1:]
    _, _, term, _, info = env.step(sample_actions(env))
    assert info["success"].dtype == torch.bool and info["success"].shape == (2,)
    # ManiSkill ends an episode on success (PushCube has no fail signal)
    assert torch.equal(term, info["success"] | info.get("fail", torch.zeros_like(term)))


def test_outputs_are_owned(env):
    obs, info = env.reset(seed=2)
    kept_obs, kept_success = obs.clone(), info["success"].clone()
    obs2, _, _, _, info2 = env.step(sample_actions(env))
    env.reset(seed=3)
    assert torch.equal(obs, kept_obs) and torch.equal(info["success"], kept_success)
    assert not torch.equal(obs2, obs)


def test_no_time_limit_interference(env):
    """Truncation comes from the adapter's own counter: exactly at max_episode_steps, per env."""
    env.reset(seed=4)
    zero = torch.zeros_like(sample_actions(env))
    for t in range(1, LIMIT):
        _, _, _, trunc, _ = env.step(zero)
        assert not trunc.any(), t
        if t == 3:
            env.reset(env_idx=[1])  # env 1 restarts its clock
    _, _, term, trunc, _ = env.step(zero)
    assert bool(trunc[0] or term[0]) and not trunc[1]
    # no autoreset underneath: stepping past the limit keeps going from the terminal state
    obs_before = env.step(zero)[0]
    assert obs_before.shape == (2, *env.single_observation_space.shape)


def test_async_vectorization_with_spawn():
    """cpu_vectorization=async: one process per env (spawn), same interface and partial resets."""
    env = make_env(2, seed=0, cpu_vectorization="async", async_context="spawn")
    try:
        obs, _ = env.reset(seed=9)
        sync = make_env(2, seed=0)
        try:
            torch.testing.assert_close(obs, sync.reset(seed=9)[0])  # same seeds, same states
        finally:
            sync.close()
        for i in range(2):
            obs, *_ = env.step(sample_actions(env, seed=i))
        after, _ = env.reset(env_idx=[0])
        torch.testing.assert_close(after[1], obs[1])
        assert not torch.equal(after[0], obs[0])
        frames = env.render([1])  # each worker pays its own first render: ask one
        assert frames.shape == (1, SIZE, SIZE, 3) and frames.dtype == torch.uint8
    finally:
        env.close()


def test_construction_resets_once_and_the_first_reset_takes_the_seed(monkeypatch):
    """ManiSkill's env resets itself while it is built; the adapter adds no reset of its own, and
    the caller's first reset (without a seed) seeds env i with the adapter's seed + i."""
    from mani_skill.envs.sapien_env import BaseEnv

    seeds = []
    real = BaseEnv.reset

    def reset(self, seed=None, options=None):
        seeds.append(seed)
        return real(self, seed=seed, options=options)

    monkeypatch.setattr(BaseEnv, "reset", reset)
    env = make_env(2, seed=3)
    try:
        assert len(seeds) == 2  # one per sub-env: ManiSkill's own, while it is built
        env.reset()
        assert seeds[2:] == [3, 4]
    finally:
        env.close()


def test_gpu_adapter_adds_no_reset_and_seeds_each_sub_scene(monkeypatch):
    """The batched GPU adapter, with ManiSkill's env faked (no GPU needed): nothing is reset while
    it is built, and a reset with seed s hands ManiSkill the seeds s + i."""
    seeds = []

    class Batched:
        control_timestep = 0.05
        device = torch.device("cpu")
        single_observation_space = gym.spaces.Box(-1.0, 1.0, (3,))
        single_action_space = gym.spaces.Box(-1.0, 1.0, (2,))
        _init_raw_obs = torch.zeros(3, 3)  # the observation of ManiSkill's reset while built
        unwrapped = property(lambda self: self)

        def reset(self, seed=None, options=None):
            seeds.append(seed)
            return torch.zeros(3, 3), {}

    monkeypatch.setattr(ms, "build_maniskill_env", lambda *args, **kwargs: Batched())
    monkeypatch.setattr(ms, "gpu_env_kwargs", lambda kwargs, num_envs, device: kwargs)
    env = ms.ManiSkillGPUEnv(make_cfg(), {}, 3, torch.device("cpu"), LIMIT, seed=5)
    assert seeds == []
    env.reset()  # the first reset takes the adapter's seed
    env.reset(seed=7, env_idx=[1])
    assert seeds == [[5, 6, 7], [7, 8, 9]]


def test_bad_config_fails_before_building():
    """What the schema refuses, what the entry point's check before work refuses (what only
    ManiSkill knows), and what ManiSkill refuses while building (sync: in-process)."""
    from rlrec.envs.factory import check_ready

    with pytest.raises(ConfigError, match="env.obs_mode='depth'.*state, rgb, rgb_state"):
        make_cfg(obs_mode="depth")
    with pytest.raises(ConfigError, match="env.cpu_vectorization"):
        make_cfg(cpu_vectorization="threads")
    with pytest.raises(ConfigError, match="env.async_context.*fork"):
        make_cfg(cpu_vectorization="async", async_context="fork")
    for cfg, sim, match in (
        (make_cfg(id="NoSuchTask-v9"), SimConfig(), "not a registered ManiSkill env.*env.imports"),
        (make_cfg(reward_mode="shaped"), SimConfig(), "env.reward_mode"),
        (make_cfg(imports=["no_such_module_xyz"]), SimConfig(), "env.imports"),
        (make_cfg(), SimConfig(name="cpu", device="cuda"), "sim=cpu with sim.device=cuda"),
    ):
        with pytest.raises(ConfigError, match=match):
            check_ready(cfg, sim)
    with pytest.raises(ConfigError, match="env.control_mode='nope'.*pd_joint_delta_pos"):
        make_env(1, control_mode="nope")


def test_env_needing_download_fails_without_prompt(monkeypatch):
    from mani_skill.utils.registration import REGISTERED_ENVS

    if not ms.missing_assets(REGISTERED_ENVS["PickSingleYCB-v1"]):
        pytest.skip("YCB assets are downloaded on this machine")

    def no_stdin(*a, **k):
        raise AssertionError("something read stdin")

    monkeypatch.setattr("builtins.input", no_stdin)
    with pytest.raises(ConfigError, match="download_asset PickSingleYCB-v1"):
        make_env(id="PickSingleYCB-v1")


def test_missing_extra_says_what_to_install(monkeypatch):
    for name in [m for m in sys.modules if m == "mani_skill" or m.startswith("mani_skill.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mani_skill", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"maniskill extra.*pip install -e \.\[maniskill\]"):
        make_env()


def test_gpu_without_cuda_fails_early():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    from rlrec.envs.factory import make_adapter

    with pytest.raises(ConfigError, match="sim=gpu.*CUDA"):
        make_adapter(make_cfg(), SimConfig(name="gpu", device="cuda"), 2, seed=0)


def test_user_registered_env_via_imports(tmp_path, monkeypatch):
    mod = tmp_path / "my_ms_tasks.py"
    mod.write_text(
        "from mani_skill.envs.tasks.tabletop.push_cube import PushCubeEnv\n"
        "from mani_skill.utils.registration import register_env\n"
        "@register_env('RlrecTestPushCube-v1', max_episode_steps=5)\n"
        "class MyPush(PushCubeEnv):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError):
        make_env(1, id="RlrecTestPushCube-v1")  # not imported: not registered
    env = make_env(1, id="RlrecTestPushCube-v1", imports=["my_ms_tasks"], max_episode_steps=None)
    try:
        assert env.max_episode_steps == 5  # the registered limit when env.max_episode_steps is null
        _, _, _, trunc, _ = env.step(torch.zeros(1, 8))
        assert trunc.shape == (1,)
    finally:
        env.close()
