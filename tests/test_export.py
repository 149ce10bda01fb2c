"""rlrec.export: the exported policy acts as the checkpoint does (TorchScript exactly, ONNX within
1e-5, on 1,000 observations of the env), eval_only of an export evaluates and records as eval_only
of its checkpoint does, the closed-loop check passes a good export and rejects a wrong one, and bad
input is refused in one line before anything is written."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import torch

import rlrec
from rlrec.checks import ConfigError
from rlrec.export import export
from rlrec.export.__main__ import main
from rlrec.obs import map_obs
from rlrec.ppo.ppo import PPO
from rlrec.train import checkpoint as ckpt
from rlrec.train.runner import Runner
from rlrec.train.stack import make_env_stack
from tests.helpers import FAST, REPO, make_config
from tests.test_checkpoint import flip_tensor_bytes

onnx = pytest.importorskip("onnx", reason="needs the export extra: pip install 'rlrec[export]'")
ort = pytest.importorskip("onnxruntime", reason="needs the export extra")

MANISKILL = pytest.param(
    ["env=maniskill", "env.num_envs=4", "env.max_episode_steps=20"],
    marks=[pytest.mark.slow, pytest.mark.maniskill],
    id="maniskill",
)
MUJOCO = pytest.param(["env=gymnasium", "env.id=InvertedPendulum-v5"], id="mujoco")


def _skip_without(overrides) -> None:
    for key, module in (("env=maniskill", "mani_skill"), ("env.id=InvertedPendulum-v5", "mujoco")):
        if key in overrides:
            pytest.importorskip(module)


def _train(run_dir: Path, overrides) -> Path:
    run_dir.mkdir(parents=True)
    Runner(make_config([*FAST, *overrides]), run_dir).run()
    return run_dir


def sampled(run_dir: Path, overrides, n: int = 1000):
    """``n`` observations the env of ``overrides`` gives under the checkpoint's policy of
    ``run_dir``, and that policy's deterministic actions computed by PPO itself (clamped to the
    action space's bounds, as the adapters clamp them)."""
    cfg = make_config([*FAST, *overrides])
    env = make_env_stack(cfg.env, cfg.sim, cfg.env.num_envs, seed=cfg.seed + 100).env
    space = env.single_action_space
    ppo = PPO(cfg.algo, env.single_observation_space, space, torch.device("cpu"))
    ppo.load_state_dict(ckpt.load(run_dir / "checkpoints" / "last.pt")["ppo"])

    def act(obs):
        with torch.no_grad():
            action = ppo.act_inference(obs)
        if hasattr(space, "low"):
            action = torch.clamp(action, torch.as_tensor(space.low), torch.as_tensor(space.high))
        return action

    seen = [env.reset(seed=cfg.seed + 100)[0]]
    while len(seen) * cfg.env.num_envs < n:
        seen.append(env.step(act(seen[-1]))[0])
    env.close()
    return map_obs(lambda *parts: torch.cat(parts)[:n], *seen), act


@pytest.fixture(scope="module")
def builtin_run(tmp_path_factory) -> Path:
    """A short built-in run with its eval clips."""
    run_dir = tmp_path_factory.mktemp("export") / "run"
    return _train(run_dir, ["recorder=none", "total_steps=512", "checkpoint_every=2"])


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param([], id="builtin"),
        pytest.param(["env=gymnasium", "env.id=CartPole-v1"], id="cartpole"),
        MUJOCO,
        MANISKILL,
    ],
)
def test_export_acts_as_the_checkpoint(tmp_path, overrides):
    """On 1,000 observations its env gives under the policy, both exports' actions equal the
    checkpoint's deterministic actions: TorchScript exactly, ONNX (onnxruntime itself, a batch of
    1,000) within 1e-5; policy.json names what was exported, with the files' digests."""
    _skip_without(overrides)
    quiet = ["recorder=none", "eval_env.enabled=false", "total_steps=128"]
    run_dir = _train(tmp_path / "run", [*quiet, *overrides])
    export(run_dir, fmt="both")
    obs, act = sampled(run_dir, overrides)
    want = act(obs)
    assert not torch.equal(want, want[:1].expand_as(want)), "the observations vary the action"
    assert torch.equal(rlrec.load_policy(run_dir / "exported" / "policy.pt")(obs), want)
    session = ort.InferenceSession(
        str(run_dir / "exported" / "policy.onnx"), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, {"obs": obs.numpy()})[0]
    assert float(np.abs(got.astype(np.float64) - want.numpy()).max()) <= 1e-5
    meta = json.loads((run_dir / "exported" / "policy.json").read_text())
    assert meta["step"] == ckpt.load(run_dir / "checkpoints" / "last.pt")["global_step"]
    assert meta["observation_space"]["shape"] == list(obs.shape[1:])
    for name, entry in meta["files"].items():
        raw = (run_dir / "exported" / name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(raw).hexdigest()
    saved = (run_dir / meta["checkpoint"]["path"]).read_bytes()
    assert meta["checkpoint"]["sha256"] == hashlib.sha256(saved).hexdigest()
    if not overrides:
        assert meta["env"] == "builtin" and meta["action_space"]["low"] == [-1.0, -1.0]
        assert len(meta["normalizer"]["mean"]) == 6


def _frames(path: Path) -> list:
    reader = imageio_ffmpeg.read_frames(str(path))
    next(reader)  # the metadata
    return [bytes(f) for f in reader]


def test_eval_only_of_an_export_equals_eval_only_of_its_checkpoint(builtin_run, tmp_path):
    export(builtin_run, fmt="both")
    runs = {
        kind: _train(tmp_path / kind, ["recorder=none", "eval_only=true", f"checkpoint={path}"])
        for kind, path in (
            ("checkpoint", builtin_run / "checkpoints" / "last.pt"),
            ("torchscript", builtin_run / "exported" / "policy.pt"),
            ("onnx", builtin_run / "exported" / "policy.onnx"),
        )
    }
    keys = ("step", "env", "return", "length")
    episodes = {
        k: [{x: json.loads(e)[x] for x in keys} for e in (d / "eval_episodes.jsonl").open()]
        for k, d in runs.items()
    }
    assert episodes["checkpoint"] and episodes["checkpoint"][0]["step"] == 512
    assert episodes["torchscript"] == episodes["checkpoint"]  # bit for bit
    # onnxruntime's kernels round otherwise (actions within 1e-6): the same within 1e-5
    for got, want in zip(episodes["onnx"], episodes["checkpoint"], strict=True):
        assert got == {**want, "return": pytest.approx(want["return"], abs=1e-5)}
    clips = {k: sorted((d / "videos" / "eval").glob("*.mp4")) for k, d in runs.items()}
    frames = _frames(clips["checkpoint"][0])
    assert [p.name for p in clips["checkpoint"]] == ["eval-step000000512.mp4"] and len(frames) > 10
    for kind in ("torchscript", "onnx"):
        assert [p.name for p in clips[kind]] == [p.name for p in clips["checkpoint"]]
        assert _frames(clips[kind][0]) == frames, kind


def test_training_from_an_export_is_refused(builtin_run, tmp_path):
    export(builtin_run)
    cfg = make_config([*FAST, f"checkpoint={builtin_run / 'exported' / 'policy.pt'}"])
    with pytest.raises(ConfigError, match="is an export: eval_only=true evaluates it"):
        Runner(cfg, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_load_policy_needs_no_hydra_and_no_simulator(builtin_run):
    """In a fresh process: the loaded export and checkpoint act on numpy batches of any size."""
    export(builtin_run, fmt="both")
    code = (
        "import sys, numpy as np, rlrec\n"
        "for p in sys.argv[1:]:\n"
        "    a = rlrec.load_policy(p)(np.zeros((3, 6), np.float32))\n"
        "    assert a.shape == (3, 2), a.shape\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in\n"
        "       ('hydra', 'omegaconf', 'mujoco', 'mani_skill', 'genesis', 'rlrec.envs')]\n"
        "print(bad)\n"
    )
    exported = [p for p in (builtin_run / "exported").glob("policy.*") if p.suffix != ".json"]
    paths = [str(p) for p in [builtin_run / "checkpoints" / "last.pt", *exported]]
    out = subprocess.run(
        [sys.executable, "-c", code, *paths], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_bad_input_is_refused_in_one_line_before_anything_is_written(
    builtin_run, tmp_path, capsys, monkeypatch
):
    def refused(*args) -> str:
        assert main([str(run), *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert "holds no checkpoint" in refused()
    shutil.copytree(builtin_run / "checkpoints", run / "checkpoints", dirs_exist_ok=True)
    assert "no checkpoint of step 100: export.step= one of 256, 512" in refused("export.step=100")
    formats = "export.format='tflite' is invalid: allowed values are torchscript, onnx, both"
    assert formats in refused("export.format=tflite")
    keys = "allowed keys are export.step, export.format, export.verify, export.tolerance"
    assert keys in refused("step=3")
    assert "export.verify=-1 is invalid" in refused("export.verify=-1")
    assert "export.tolerance=x is invalid: a number > 0" in refused("export.tolerance=x")
    monkeypatch.setitem(sys.modules, "onnx", None)  # the extra is not installed
    line = refused("export.format=both")
    assert "needs the 'export' extra" in line and "pip install 'rlrec[export]'" in line
    monkeypatch.undo()
    flip_tensor_bytes(run / "checkpoints" / "last.pt")
    assert "last.pt is damaged" in refused() and "export.step=S" in refused()
    assert "one of 256, 512, last.pt (unusable)" in refused("export.step=100")
    assert not (run / "exported").exists()
    # another step's export is never replaced; the same step's is completed
    assert main([str(run), "export.step=256", "export.format=onnx", "export.verify=0"]) == 0
    assert "move it aside first" in refused("export.step=512")
    assert main([str(run), "export.step=256", "export.verify=0"]) == 0
    meta = json.loads((run / "exported" / "policy.json").read_text())
    assert meta["step"] == 256 and set(meta["files"]) == {"policy.onnx", "policy.pt"}


# ---------------------------------------------------------------------- the closed-loop check
def _verified(run: Path):
    report = json.loads((run / "exported" / "verify.json").read_text())
    script, onnx_ = report["formats"]["torchscript"], report["formats"]["onnx"]
    assert script["passed"] and script["max_action_diff"] == 0 and script["max_obs_diff"] == 0
    assert onnx_["passed"] and onnx_["max_action_diff"] <= 1e-5
    assert all(e["parted_at_step"] is None for e in onnx_["episodes"])
    ref = report["checkpoint"]["episodes"]
    assert len(ref) == 4 and [e["length"] for e in onnx_["episodes"]] == [e["length"] for e in ref]
    assert [e["return"] for e in script["episodes"]] == [e["return"] for e in ref]
    return report


def test_export_is_verified_in_closed_loop(builtin_run, capsys):
    """``python -m rlrec.export RUN export.format=both``: 4 eval episodes of the run's eval env by
    the checkpoint and by each file, equal step by step; env 0's clips of each beside each other,
    on the run's page, which the command rewrites."""
    from rlrec.report.html import write_report

    write_report(builtin_run)  # the run's page, as a run with report.enabled leaves it
    assert main([str(builtin_run), "export.format=both"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].startswith("verify policy.pt: 4 episodes, max action diff 0, max obs diff 0")
    assert lines[-2].startswith("verify policy.onnx: 4 episodes") and "passed" in lines[-2]
    assert lines[-1] == f"report {builtin_run / 'report.html'}"
    out = builtin_run / "exported"
    report = _verified(builtin_run)
    assert report["step"] == 512 and report["episodes"] == 4
    ref = report["checkpoint"]["episodes"]
    assert [e["seed"] for e in ref] == [1_000_000 + i for i in range(4)]
    # the checkpoint's episodes are the run's own final evaluation's (its 2 eval envs; a batch of
    # another size rounds otherwise)
    run_eval = [json.loads(x) for x in (builtin_run / "eval_episodes.jsonl").open()]
    final = [(e["seed"], e["return"]) for e in run_eval if e["step"] == 512]
    assert final == [(e["seed"], pytest.approx(e["return"], abs=1e-5)) for e in ref[:2]]
    assert 0 < report["formats"]["onnx"]["max_action_diff"]
    want = _frames(out / report["checkpoint"]["clip"])
    assert len(want) > 10 and _frames(out / report["formats"]["torchscript"]["clip"]) == want
    assert not (out / "rejected").exists() and not list(out.glob(".verify-*"))
    page = (builtin_run / "report.html").read_text()  # the check's figures and clips, side by side
    assert "Export of step 512, checked in closed loop" in page
    for rel in ("checkpoint-env000.mp4", "torchscript-env000.mp4", "onnx-env000.mp4"):
        assert f'src="exported/verify/{rel}"' in page


class _SampledRange(torch.nn.Module):
    """A wrong export: the policy of observations clamped to the range of the 1,000 the
    forward-pass check samples (as a normaliser folded with the sampled range's clip would)."""

    def __init__(self, policy, lo, hi):
        super().__init__()
        self.policy, self.norm = policy, policy.norm  # (policy.json names the normaliser)
        self.register_buffer("lo", lo)
        self.register_buffer("hi", hi)

    def forward(self, obs):
        return self.policy(torch.minimum(torch.maximum(obs, self.lo), self.hi))


def test_closed_loop_check_fails_what_the_forward_pass_check_passes(
    builtin_run, tmp_path, monkeypatch, capsys
):
    import rlrec.export as rexport

    run = tmp_path / "run"
    shutil.copytree(builtin_run / "checkpoints", run / "checkpoints")
    obs, act = sampled(run, [])
    real = rexport.policy_of
    wrong = lambda data: _SampledRange(real(data), obs.amin(0), obs.amax(0))  # noqa: E731
    monkeypatch.setattr(rexport, "policy_of", wrong)
    assert main([str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    out = run / "exported"
    assert not (out / "policy.pt").exists()
    moved = out / "rejected" / "policy.pt"
    # the forward-pass check passes the file: on the 1,000 observations it acts as the checkpoint
    assert torch.equal(rlrec.load_policy(moved)(obs), act(obs))
    report = json.loads((out / "verify.json").read_text())["formats"]["torchscript"]
    bad = report["failed"]
    assert not report["passed"] and bad["parted_at_step"] is not None
    # the last line (a logging handler an earlier in-process Hydra run of this worker left on a
    # closed stream may print its own complaints before it)
    assert err[-1] == (
        f"verify policy.pt: 4 episodes, max action diff {report['max_action_diff']:.3g}, FAILED: "
        f"episode {bad['episode']} (seed {bad['seed']}) parts from the checkpoint's at step "
        f"{bad['parted_at_step']} (tolerance 0.0001); torchscript moved to "
        "exported/rejected/policy.pt"
    )
    assert "policy.pt" not in json.loads((out / "policy.json").read_text())["files"]
    # the same export again: its rejected file goes beside the first, never over it
    first = moved.read_bytes()
    assert main([str(run)]) == 1
    assert moved.read_bytes() == first and (out / "rejected" / "policy-1.pt").is_file()


@pytest.mark.parametrize(
    "overrides",
    [
        MUJOCO,
        pytest.param(["+experiment=builtin_pixels", "env.num_envs=4", "total_steps=128"], id="px"),
        MANISKILL,
    ],
)
def test_closed_loop_check_across_backends(tmp_path, overrides):
    """The check passes both formats of a MuJoCo task, a pixel policy and ManiSkill's CPU sim:
    TorchScript step for step equal, ONNX within the tolerance."""
    _skip_without(overrides)
    run = _train(tmp_path / "run", ["recorder=none", "total_steps=64", *overrides])
    assert main([str(run), "export.format=both"]) == 0
    _verified(run)
