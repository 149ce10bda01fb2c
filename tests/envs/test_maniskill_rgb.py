"""env=maniskill from its cameras (env.obs_mode=rgb|rgb_state) against the real simulator (CPU sim,
lavapipe Vulkan, small cameras): the observation (rlrec/obs.py's pixel dict), the GPU adapter's
code run on the CPU sim, and train.py end to end (trains, records, evaluates, resumes)."""

import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs.autoreset import AutoReset
from rlrec.envs.config import SimConfig
from rlrec.obs import shape_of
from rlrec.testing import sample_actions
from tests.envs.maniskill_util import make_cfg as _cfg
from tests.envs.maniskill_util import make_env, ms, pytestmark  # noqa: F401  (marks this module)

H, W = 36, 40  # not square: the image is [N, H, W, C]
LIMIT = 3


def make_cfg(obs_mode, **over):
    base = dict(obs_mode=obs_mode, obs_height=H, obs_width=W, max_episode_steps=LIMIT)
    return _cfg(render_width=32, render_height=32, **{**base, **over})


@pytest.fixture(scope="module")
def env():
    """Two CPU envs observing their camera and the robot's state (one simulator per module)."""
    e = ms.make(make_cfg("rgb_state"), SimConfig(), num_envs=2, device=torch.device("cpu"))
    yield e
    e.close()


def test_rgb_state_is_the_camera_and_the_robot_state(env):
    assert shape_of(env.single_observation_space) == {"rgb": (H, W, 3), "state": (25,)}
    obs, _ = env.reset(seed=1)
    obs, *_ = env.step(sample_actions(env, seed=0))
    assert obs["rgb"].dtype == torch.uint8 and obs["rgb"].shape == (2, H, W, 3)
    assert obs["state"].dtype == torch.float32 and obs["state"].shape == (2, 25)
    assert {v.device.type for v in obs.values()} == {"cpu"}
    for i, sub in enumerate(env.vec.envs):
        base = sub.unwrapped
        # the image is the sensor camera's (PushCube-v1: one, base_camera) at obs_height x width
        camera = base.get_obs(unflattened=True)["sensor_data"]["base_camera"]["rgb"][0]
        assert torch.equal(obs["rgb"][i], camera)
        # the state is ppo_rgb.py's --include-state: the robot's qpos, qvel and its TCP pose
        # (no cube, no goal: those are only in the image)
        robot = base.agent.robot
        own = torch.cat([robot.get_qpos(), robot.get_qvel(), base.agent.tcp.pose.raw_pose], 1)
        torch.testing.assert_close(obs["state"][i], own[0])
    assert not torch.equal(obs["rgb"][0], obs["rgb"][1])  # each env its own scene


def test_final_obs_at_an_autoreset_is_the_terminal_observation(env):
    actions = [sample_actions(env, seed=10 + t) for t in range(LIMIT)]
    stack = AutoReset(env)
    stack.reset(seed=2)
    for a in actions:
        obs, _, term, trunc, info = stack.step(a)
    assert (term | trunc).all()
    final = info["final_obs"]
    env.reset(seed=2)  # the same episodes again, without the autoreset: their last observation
    for a in actions:
        terminal, *_ = env.step(a)
    for k in ("rgb", "state"):
        assert final[k].dtype == terminal[k].dtype and torch.equal(final[k], terminal[k])
    assert not torch.equal(final["rgb"], obs["rgb"])  # obs: the reset state's


def test_the_gpu_adapter_observes_its_cameras(monkeypatch):
    """``sim=gpu``'s adapter (the batched ``ManiSkillGPUEnv``: wrapper, owned copies on the
    adapter's device, the dict through reset and step) on a real env of the CPU sim: only the
    backends ManiSkill is given are the CPU's (there is no GPU here)."""
    given = {}

    def cpu_kwargs(kwargs, num_envs, device):
        given.update(kwargs)
        return {**kwargs, "num_envs": num_envs, "sim_backend": "physx_cpu", "render_backend": "cpu"}

    monkeypatch.setattr(ms, "require_gpu_library", lambda: None)
    monkeypatch.setattr(ms, "gpu_env_kwargs", cpu_kwargs)
    gpu = SimConfig(name="gpu", device="cpu")
    env = ms.make(make_cfg("rgb"), gpu, num_envs=1, device=torch.device("cpu"), seed=0)
    try:
        assert isinstance(env, ms.ManiSkillGPUEnv)
        assert given["obs_mode"] == "rgb"  # ppo_rgb.py's; rlrec's rgb drops the state part
        assert given["sensor_configs"] == {"width": W, "height": H}
        assert shape_of(env.single_observation_space) == {"rgb": (H, W, 3)}
        first, _ = env.reset(env_idx=[])  # no reset yet: ManiSkill's own, while it was built
        assert set(first) == {"rgb"} and first["rgb"].shape == (1, H, W, 3)
        obs, _ = env.reset(seed=3)
        stepped, *_ = env.step(sample_actions(env, seed=1))
        for o in (obs, stepped):
            assert set(o) == {"rgb"} and o["rgb"].dtype == torch.uint8
            assert o["rgb"].shape == (1, H, W, 3) and o["rgb"].device == env.device
        camera = env.base.get_obs(unflattened=True)["sensor_data"]["base_camera"]["rgb"]
        assert torch.equal(stepped["rgb"], camera)
        assert stepped["rgb"].data_ptr() != camera.data_ptr()  # owned, not the camera's buffer
        again, _ = env.reset(env_idx=[])  # the last observation, as a copy
        assert torch.equal(again["rgb"], stepped["rgb"])
        assert again["rgb"].data_ptr() != stepped["rgb"].data_ptr()
    finally:
        env.close()


def test_a_task_without_a_sensor_camera_is_refused_naming_the_obs_mode():
    """ManiSkill's flatten wrapper reads the first sensor camera: a task with none is refused with
    a ConfigError naming env.obs_mode once it is built (not a StopIteration inside the wrapper)."""
    from mani_skill.envs.tasks import PushCubeEnv
    from mani_skill.utils.registration import REGISTERED_ENVS, register_env

    if "RlrecNoCamera-v1" not in REGISTERED_ENVS:

        @register_env("RlrecNoCamera-v1", max_episode_steps=LIMIT)
        class NoCamera(PushCubeEnv):
            @property
            def _default_sensor_configs(self):
                return []

    with pytest.raises(ConfigError, match="env.obs_mode=rgb observes the task's sensor cameras, "):
        ms.make(make_cfg("rgb", id="RlrecNoCamera-v1"), SimConfig(), 1, torch.device("cpu"))
    # the same task observing its state is built as any other
    env = ms.make(make_cfg("state", id="RlrecNoCamera-v1"), SimConfig(), 1, torch.device("cpu"))
    env.close()


@pytest.mark.slow
def test_train_py_trains_records_evaluates_and_resumes_from_the_camera(tmp_path):
    """PushCube-v1 from its camera (obs_mode=rgb, NatureCNN) through train.py: it trains,
    records the render camera's clips, evaluates, and resumes from its checkpoint."""
    from rlrec.testing import decode
    from rlrec.train import checkpoint as ckpt
    from tests.helpers import read_metrics, run_train

    run = tmp_path / "run"
    args = "env=maniskill env.obs_mode=rgb env.render_width=64 env.render_height=48 env.num_envs=2"
    args += " env.max_episode_steps=6 algo.encoder=cnn algo.num_steps=8 algo.num_minibatches=2"
    args += " algo.update_epochs=1 eval_env.num_envs=2 eval_env.every=2 recorder.lossless=true"
    args = [*args.split(), "logger=none", "logger.progress=false", "report.enabled=false"]
    args += [f"env.obs_height={H}", f"env.obs_width={W}", f"hydra.run.dir={run}"]
    run_train([*args, "total_steps=32"], cwd=tmp_path, timeout=600)
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics if "eval/success" in m] == [0, 32]
    losses = [m["loss/value"] for m in metrics if "loss/value" in m]
    assert len(losses) == 2 and all(v == v for v in losses)
    clips = sorted((run / "videos" / "eval").glob("*.mp4"))
    assert clips and list((run / "videos" / "train").glob("*.mp4"))
    frames, _ = decode(str(clips[-1]))
    assert frames.shape[1:] == (48, 64, 3)  # the render camera's clip, not the observed image
    data = ckpt.load(run / "checkpoints" / "last.pt")
    assert data["obs_shape"] == {"rgb": (H, W, 3)}
    assert data["next_obs"]["rgb"].dtype == torch.uint8
    run_train([*args, "total_steps=48", "resume=auto"], cwd=tmp_path, timeout=600)
    assert ckpt.load(run / "checkpoints" / "last.pt")["global_step"] == 48
    assert read_metrics(run)[-1]["step"] == 48
