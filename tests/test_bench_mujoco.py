"""scripts/bench_mujoco.py's reference sides and the tuned MuJoCo preset they run beside: the
Zoo's values per task, their translation into SB3's terms, CleanRL's script prepared and read."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from tests.helpers import REPO, make_config

sys.path.insert(0, str(REPO / "scripts"))

import bench_mujoco  # noqa: E402
from bench_sb3_ppo import sb3_settings  # noqa: E402

# RL Baselines3 Zoo's hyperparams/ppo.yml (the "Tuned" MuJoCo section): n_steps, batch_size,
# n_epochs, learning_rate, gamma, gae_lambda, clip_range, ent_coef, vf_coef, max_grad_norm
ZOO = {
    "HalfCheetah-v4": (512, 64, 20, 2.0633e-05, 0.98, 0.92, 0.1, 0.000401762, 0.58096, 0.8),
    "Hopper-v4": (512, 32, 5, 9.80828e-05, 0.999, 0.99, 0.2, 0.00229519, 0.835671, 0.7),
    "Walker2d-v4": (512, 32, 20, 5.05041e-05, 0.99, 0.95, 0.1, 0.000585045, 0.871923, 1.0),
}


@pytest.mark.parametrize("task", sorted(ZOO))
def test_tuned_preset_is_the_zoos_ppo_in_rlrecs_and_sb3s_terms(task):
    cfg = make_config(["+experiment=mujoco_tuned", f"zoo={task}"])
    n_steps, batch, epochs, lr, gamma, lam, clip, ent, vf, max_norm = ZOO[task]
    a, zoo = cfg.algo, (lr, gamma, lam, clip, ent)
    assert (cfg.env.id, cfg.env.num_envs) == (task, 1)
    assert (a.num_steps, a.update_epochs, n_steps // a.num_minibatches) == (n_steps, epochs, batch)
    assert (a.learning_rate, a.gamma, a.gae_lambda, a.clip_coef, a.ent_coef) == zoo
    assert a.vf_coef == pytest.approx(2 * vf)  # SB3's value loss has no factor 1/2
    assert (a.anneal_lr, a.clip_vloss, a.grad_clip, a.target_kl) == (False, False, "joint", None)
    settings = sb3_settings(cfg)
    ppo, norm, kwargs = settings["ppo"], settings["normalize"], settings["ppo"]["policy_kwargs"]
    assert (ppo["n_steps"], ppo["batch_size"], ppo["n_epochs"]) == (n_steps, batch, epochs)
    keys = ("learning_rate", "gamma", "gae_lambda", "clip_range", "ent_coef", "max_grad_norm")
    assert tuple(ppo[k] for k in keys) == (*zoo, max_norm) and ppo["vf_coef"] == pytest.approx(vf)
    assert ppo["clip_range_vf"] is None and kwargs["optimizer_kwargs"]["eps"] == 1e-5
    assert norm == {"norm_obs": True, "norm_reward": True, "clip_reward": 10.0, "gamma": gamma}
    default = task == "Walker2d-v4"  # no policy_kwargs in the Zoo: SB3's MlpPolicy defaults
    net = [64, 64] if default else [256, 256]
    want = (True, 0.0, "Tanh") if default else (False, -2.0, "ReLU")
    assert kwargs["net_arch"] == {"pi": net, "vf": net}
    assert (kwargs["ortho_init"], kwargs["log_std_init"], kwargs["activation_fn"].__name__) == want


def test_sb3_side_maps_cleanrls_settings_and_refuses_what_sb3_cannot_run():
    cfg = make_config(["+experiment=mujoco", "env.id=HalfCheetah-v4"])
    ppo = sb3_settings(cfg)["ppo"]
    assert ppo["clip_range_vf"] == 0.2 and ppo["batch_size"] == 64
    assert ppo["learning_rate"](0.25) == pytest.approx(0.25 * 3e-4)  # annealed: SB3's schedule
    with pytest.raises(SystemExit, match="algo.grad_clip=per_network"):
        sb3_settings(make_config([]))  # rlrec's default clips each network on its own


def test_cleanrl_copy_gets_the_observation_space_line_and_refuses_another_script(tmp_path):
    script = tmp_path / "ppo_continuous_action.py"
    script.write_text(f"env = gym.wrappers.TransformObservation(env, {bench_mujoco.CLEANRL_LINE}\n")
    copy = bench_mujoco.cleanrl_copy(script, tmp_path / "sitting")
    assert copy.is_absolute() and copy.parent == tmp_path / "sitting"
    assert bench_mujoco.CLEANRL_FIX in copy.read_text()
    assert bench_mujoco.CLEANRL_LINE in script.read_text()  # the user's file is left as it was
    other = tmp_path / "other.py"
    other.write_text("print('hi')\n")
    with pytest.raises(SystemExit, match="016ca33"):
        bench_mujoco.cleanrl_copy(other, tmp_path / "sitting2")


def test_cleanrl_run_keeps_the_returns_it_printed_and_the_table_reads_them(tmp_path, capsys):
    """A stand-in for CleanRL's script printing its episodic_return lines: the side's result and
    the table's last-10-episode mean come from them."""
    fake = tmp_path / "fake_cleanrl.py"
    fake.write_text(
        textwrap.dedent(
            """
            import sys
            for i in range(12):
                print(f"global_step={1000 * (i + 1)}, episodic_return={float(i)}")
            print("SPS: 10")
            """
        )
    )
    sweep = tmp_path / "sitting"
    out = sweep / "cleanrl" / "HalfCheetah-v4" / "seed1"
    bench_mujoco.run_cleanrl(fake, "HalfCheetah-v4", 1, 4096, out)
    result = json.loads((out / "result.json").read_text())
    assert result["train"]["returns"] == [float(i) for i in range(12)] and result["steps"] == 4096
    figures = bench_mujoco.collect([sweep])["HalfCheetah-v4"]["cleanrl"]
    assert figures[0]["train"] == pytest.approx(sum(range(2, 12)) / 10)  # the last 10 episodes
    bench_mujoco.print_table([sweep])
    assert "HalfCheetah-v4 | cleanrl | 1 | 6.50 +- 0.00 | - |" in capsys.readouterr().out
