"""env=genesis against real Genesis (CPU backend, headless GL): the adapter contract, one gs.init
per process, sequential adapters, stale-frame protection, and the clear errors raised before any
work. The error tests that do not need Genesis run on a light install too."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs import genesis as ga
from rlrec.envs.config import SimConfig
from rlrec.envs.factory import make_adapter
from rlrec.envs.genesis import GenesisEnvConfig
from rlrec.testing import EnvContract
from tests.envs.genesis_util import RENDER_ATOL, diff, genesis_cfg, make_genesis
from tests.helpers import REPO

_skip = pytest.mark.skipif(
    __import__("importlib").util.find_spec("genesis") is None,
    reason="needs the genesis extra: bash scripts/setup_genesis.sh",
)


def needs_genesis(obj):
    return pytest.mark.genesis(_skip(obj))


# ------------------------------------------------------------------------ errors, no Genesis needed


def test_missing_extra_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "genesis", None)  # import genesis -> ImportError
    with pytest.raises(
        ConfigError,
        match=r"env=genesis needs the genesis extra.*"
        r"pip install -e '\.\[genesis\]'.*setup_genesis\.sh",
    ):
        make_adapter(GenesisEnvConfig(num_envs=2), SimConfig(), 2, seed=0)


def test_sim_gpu_without_cuda_fails_before_genesis(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "genesis", None)  # proves nothing of Genesis was touched
    with pytest.raises(ConfigError, match="sim=gpu .*needs CUDA"):
        make_adapter(GenesisEnvConfig(num_envs=2), SimConfig(name="gpu", device="cuda"), 2, seed=0)


class _Camera:
    """A camera's render() as the rasterizer answers: numpy RGBA images, one per rendered env,
    in a buffer of its own that the next render overwrites."""

    def __init__(self, images):
        self.images = images

    def render(self, rgb=True, force_render=False):
        assert rgb and force_render
        return self.images, None, None, None


def test_frames_come_back_on_the_cpu_whatever_the_sim_device():
    """The recorder's encoder reads frames on the CPU: the rasterizer's CPU images are handed over
    as they are (an owned copy), not sent to the sim's device and copied back. ``meta`` stands for
    CUDA here: a frame on it would be a round trip through the device."""
    images = np.arange(3 * 4 * 5 * 4, dtype=np.uint8).reshape(3, 4, 5, 4)
    adapter = object.__new__(ga.GenesisAdapter)
    adapter.camera, adapter.num_envs = _Camera(images), 3
    adapter.device = torch.device("meta")
    adapter._rows, adapter._frames = {0: 0, 1: 1, 2: 2}, None
    adapter._camera_name = "'camera' of tests.Fake"
    frames = adapter.render([2, 0])
    assert frames.device.type == "cpu" and frames.dtype == torch.uint8
    assert frames.shape == (2, 4, 5, 3) and frames.is_contiguous()
    assert torch.equal(frames, torch.from_numpy(images[[2, 0], ..., :3].copy()))
    images[:] = 0  # the camera's buffer is reused by its next render: the frames are a copy
    assert int(frames.max()) > 0


@pytest.mark.parametrize("initialised", [True, False])
def test_sim_gpu_refuses_genesis_on_the_cpu(monkeypatch, initialised):
    """Genesis already initialised on a GPU backend with its tensors on the CPU
    (GS_TORCH_FORCE_CPU_DEVICE=1), or gs.init(backend=gs.gpu) taking the CPU with a warning when
    no CUDA works (faked here as genesis-world 1.4.5's gs.init does it; the real fallback, in a
    process of its own: the next test): sim=gpu is refused, naming sim=gpu."""
    gs = pytest.importorskip("genesis")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # rlrec's early check passes
    asked = []

    def init(backend, **kwargs):
        asked.append(backend)
        monkeypatch.setattr(gs, "_initialized", True)
        monkeypatch.setattr(gs, "backend", gs.cpu)

    monkeypatch.setattr(gs, "init", init)
    monkeypatch.setattr(gs, "_initialized", initialised)
    monkeypatch.setattr(gs, "backend", gs.cuda)
    monkeypatch.setattr(gs, "device", torch.device("cpu"))
    with pytest.raises(
        ConfigError, match=r"sim=gpu: Genesis runs on backend .* on cpu, not on CUDA"
    ):
        ga.init_genesis("gpu")
    assert asked == ([] if initialised else [gs.gpu])


_REAL_FALLBACK = """
import torch
from rlrec.config import ConfigError
from rlrec.envs import genesis as ga
from rlrec.envs.config import SimConfig
from rlrec.envs.factory import make_adapter

gs = ga.import_genesis()
torch.cuda.is_available = lambda: False
try:
    make_adapter(ga.GenesisEnvConfig(num_envs=2), SimConfig(name="gpu", device="cuda"), 2, 0)
    print("accepted without CUDA:", gs.backend)
except ConfigError as e:
    print("refused before gs.init:", not gs._initialized, e)
torch.cuda.is_available = lambda: True  # rlrec's checks pass; Genesis finds no CUDA build of torch
try:
    ga.init_genesis("gpu")
    print("accepted the fallback:", gs.backend)
except ConfigError as e:
    print("refused the fallback:", gs._initialized and gs.backend == gs.cpu, e)
"""


@needs_genesis
def test_sim_gpu_refuses_the_real_cpu_fallback_in_a_new_process(tmp_path):
    """Real gs.init under faked CUDA (gs.init runs once per process: a process of its own, about
    20 s of CPU, most of it importing Genesis)."""
    if torch.version.cuda:
        pytest.skip("needs a CPU build of torch: Genesis must find no usable CUDA")
    cmd = [sys.executable, "-c", _REAL_FALLBACK]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [x for x in out.stdout.splitlines() if x.startswith(("accepted", "refused"))]
    assert out.returncode == 0 and len(lines) == 2, out.stdout + out.stderr
    assert lines[0].startswith("refused before gs.init: True sim=gpu (device=cuda) needs CUDA")
    assert lines[1].startswith("refused the fallback: True sim=gpu: Genesis runs on backend"), lines


def test_gl_platform_is_set_but_never_clobbered(monkeypatch):
    monkeypatch.setenv("PYOPENGL_PLATFORM", "osmesa")
    ga.import_genesis()
    assert os.environ["PYOPENGL_PLATFORM"] == "osmesa"
    monkeypatch.delenv("PYOPENGL_PLATFORM")
    ga.import_genesis()
    assert os.environ.get("PYOPENGL_PLATFORM") in ("egl", "osmesa", None)


# --------------------------------------------------------------------------- errors on real Genesis


@needs_genesis
def test_camera_attr_names_the_key_and_the_cameras_or_runs_without_one():
    cfg = genesis_cfg(2, 6)
    cfg.camera_attr = "cam"
    with pytest.raises(
        ConfigError,
        match=r"env\.camera_attr='cam' is invalid: .*FrankaReach has no attribute 'cam' "
        r"\(its cameras: camera\)",
    ):
        ga.make(cfg, SimConfig(), 2, torch.device("cpu"), 0)
    cfg.camera_attr = "robot"
    with pytest.raises(
        ConfigError, match=r"env\.camera_attr='robot' is invalid: .*not a Genesis camera"
    ):
        ga.make(cfg, SimConfig(), 2, torch.device("cpu"), 0)
    cfg.camera_attr = None  # no camera: it runs, and rendering says why not
    env = ga.make(cfg, SimConfig(), 2, torch.device("cpu"), 0)
    try:
        env.reset(seed=0)
        env.step(torch.zeros(2, 7))
        with pytest.raises(ConfigError, match="env.camera_attr=null"):
            env.render([0])
    finally:
        env.close()


@needs_genesis
def test_bad_target_is_a_config_error():
    for target, msg in (
        ("nodots", "dotted path"),
        ("no_such_module.Env", "cannot be imported"),
        ("rlrec.envs.genesis_tasks.Nope", "has no attribute 'Nope'"),
        ("rlrec.envs.builtin.PointReach", "does not follow the GenesisTask protocol"),
    ):
        cfg = genesis_cfg(2, 6)
        cfg._target_ = target
        with pytest.raises((ConfigError, TypeError), match=msg):
            ga.make(cfg, SimConfig(), 2, torch.device("cpu"), 0)


@needs_genesis
def test_genesis_is_initialised_once_and_other_backend_is_refused():
    import genesis as gs

    first = ga.init_genesis("cpu")
    assert ga.init_genesis("cpu") is first and gs._initialized
    with pytest.raises(Exception, match="already initialized"):
        gs.init(backend=gs.cpu)  # the Genesis fact the adapter works around
    with pytest.raises(ConfigError, match="already initialised .* new process"):
        ga.init_genesis("gpu")


# --------------------------------------------------------------------------- contract


@needs_genesis
class TestGenesisContract(EnvContract):
    num_envs = 3
    render_atol = RENDER_ATOL
    max_steps_to_truncation = 6

    def make_env(self, num_envs, seed=None):
        return make_genesis(num_envs, limit=6, seed=seed)

    @pytest.fixture(scope="class")
    def env(self):  # one scene for the whole suite: building one takes seconds
        env = self.make_env(self.num_envs, seed=self.seed)
        yield env
        env.close()


# --------------------------------------------------------------------------- Genesis specifics


@needs_genesis
def test_sequential_adapters_in_one_process():
    """A sweep in one process: the second adapter works after the first one closed."""
    a = make_genesis(2, limit=4, seed=1)
    obs_a, _ = a.reset(seed=5)
    frame_a = a.render([1])
    a.close()
    a.close()  # idempotent
    b = make_genesis(2, limit=4, seed=1)
    try:
        obs_b, _ = b.reset(seed=5)
        torch.testing.assert_close(obs_a, obs_b)
        assert diff(b.render([1]), frame_a) <= RENDER_ATOL
        obs, rew, term, trunc, info = b.step(torch.zeros(2, 7))
        assert (
            obs.shape == (2, 23)
            and info["success"].dtype == torch.bool
            and info["distance"].shape == (2,)
        )
    finally:
        b.close()


@needs_genesis
def test_reset_without_step_is_rendered():
    """Genesis's camera alone returns the old image after a reset's pose writes without a step;
    the adapter's render shows the reset pose, although a render of the state before it was
    served already."""
    env = make_genesis(2, limit=6, seed=0)
    try:
        env.reset(seed=0)
        env.step(torch.zeros(2, 7))
        before = env.render([0, 1])
        env.reset(env_idx=[0])  # pose writes (set_dofs_position, set_pos), no scene.step
        raw = torch.as_tensor(env.task.camera.render(rgb=True)[0])
        after = env.render([0, 1])
        assert diff(raw[0], before[0]) <= RENDER_ATOL, (
            "Genesis no longer returns a stale image: revisit the note"
        )
        assert diff(after[0], before[0]) > RENDER_ATOL
        assert diff(after[1], before[1]) <= RENDER_ATOL
    finally:
        env.close()


@needs_genesis
def test_rendered_envs_idx_limits_what_can_be_rendered():
    env = make_genesis(3, limit=6, seed=0, rendered_envs_idx=[2])
    try:
        env.reset(seed=0)
        assert env.render([2]).shape == (1, 64, 64, 3)
        with pytest.raises(
            ConfigError,
            match=r"env \[0\] cannot be rendered.*draws envs \[2\] only.*recorder\.env_idx",
        ):
            env.render([0])
    finally:
        env.close()


# --------------------------------------------------------------------------- train.py end to end


@needs_genesis
@pytest.mark.slow
def test_train_py_sweep_of_two_genesis_runs_in_one_process(tmp_path):
    """``python train.py -m env=genesis seed=1,2``: Hydra's basic launcher runs both jobs in one
    process, so the second run builds its scenes after the first closed its own (gs.init once).
    Episodes of 20 steps (FrankaReach's own: 100), so that each run still ends episodes, records
    and evaluates (every rendered frame costs ~17 ms on the CPU rasterizer); no report."""
    from tests.helpers import read_metrics, run_train

    args = "-m env=genesis seed=1,2 env.num_envs=4 env.max_episode_steps=20 env.render_width=64"
    args += " env.render_height=64 eval_env.num_envs=2 eval_env.every=1 algo.num_steps=16"
    args += " algo.num_minibatches=2 total_steps=128 logger=none logger.progress=false"
    args = [*args.split(), "report.enabled=false", f"hydra.sweep.dir={tmp_path}/sweep"]
    run_train(args, cwd=tmp_path, timeout=600)
    for job in ("0", "1"):
        run = tmp_path / "sweep" / job
        evals = [m for m in read_metrics(run) if "eval/return" in m]
        assert evals and "eval/success" in evals[-1]
        assert list((run / "videos" / "eval").glob("*.mp4")) and list(
            (run / "videos" / "train").glob("*.mp4")
        )
