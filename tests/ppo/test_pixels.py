"""PPO from pixels on the built-in env: the observation (rlrec/obs.py), the uint8 storage, the
NatureCNN encoder, the normaliser on the state part, the refusals before work, the memory
estimate (a real run: tests/ppo/test_pixel_paths.py)."""

import gymnasium as gym
import pytest
import torch
from torch import nn

from rlrec.checks import ConfigError
from rlrec.envs.builtin import PointReach
from rlrec.obs import shape_of
from rlrec.ppo.agent import ActorCritic, NatureCNN, ObsNormalizer
from rlrec.ppo.config import PPOConfig
from rlrec.ppo.ppo import PPO
from tests.helpers import make_config
from tests.ppo import CPU


def _space(h=36, w=36, state=4):
    spaces = {"rgb": gym.spaces.Box(0, 255, (h, w, 3), "uint8")}
    if state:
        spaces["state"] = gym.spaces.Box(-10, 10, (state,))
    return gym.spaces.Dict(spaces)


def test_builtin_pixel_obs_is_its_own_drawing_of_the_state():
    env = PointReach(num_envs=5, obs_mode="rgb_state", obs_width=40, obs_height=36)
    obs, _ = env.reset(seed=3)
    obs, *_ = env.step(torch.rand(5, 2) * 2 - 1)
    assert shape_of(env.single_observation_space) == {"rgb": (36, 40, 3), "state": (4,)}
    assert env.single_observation_space["rgb"].dtype == "uint8"
    assert obs["rgb"].dtype == torch.uint8 and obs["rgb"].shape == (5, 36, 40, 3)
    assert torch.equal(obs["rgb"], env.draw(env.pos, env.goal, env.t, (36, 40)))
    assert torch.equal(obs["state"], torch.cat([env.pos, env.vel], dim=1))
    # the goal is seen: its colour is in every image, and images of different goals differ
    assert (
        (obs["rgb"] == torch.tensor([60, 200, 90], dtype=torch.uint8)).all(-1).any(-1).any(-1).all()
    )
    assert not torch.equal(obs["rgb"][0], obs["rgb"][1])
    assert env.render(None).shape == (5, 128, 128, 3)  # the render size is its own
    rgb_only, _ = PointReach(num_envs=2, obs_mode="rgb", obs_width=36, obs_height=36).reset()
    assert set(rgb_only) == {"rgb"}


def test_storage_keeps_images_as_uint8():
    cfg = PPOConfig(encoder="cnn", num_steps=3, num_minibatches=2)
    ppo = PPO(cfg, _space(), gym.spaces.Box(-1, 1, (2,)), CPU)
    storage = ppo.init_storage(num_envs=4)
    assert storage.obs["rgb"].dtype == torch.uint8 and storage.obs["state"].dtype == torch.float32
    images, no = torch.randint(0, 256, (3, 4, 36, 36, 3), dtype=torch.uint8), torch.zeros(4) > 0
    with ppo.rollout_mode():  # as the runner collects
        for rgb in images:
            ppo.act({"rgb": rgb, "state": torch.randn(4, 4)})
            ppo.process_env_step(torch.zeros(4), no, no, {})
    assert torch.equal(storage.obs["rgb"], images)  # the raw bytes, unscaled
    batches = list(storage.minibatches(2))
    assert [mb["obs"]["rgb"].dtype for mb in batches] == [torch.uint8] * 2
    assert sum(mb["obs"]["rgb"].shape[0] for mb in batches) == 12
    assert ppo.update()["loss/updates"] > 0


def test_nature_cnn_matches_ppo_rgb_and_scales_on_the_device():
    cnn = NatureCNN({"rgb": (64, 64, 3), "state": (4,)})
    convs = [m for m in cnn.cnn if isinstance(m, nn.Conv2d)]
    layers = [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs]
    assert layers == [(32, 8, 4), (64, 4, 2), (64, 3, 1)] and convs[0].kernel_size == (8, 8)
    linear = [m for m in cnn.cnn if isinstance(m, nn.Linear)][0]
    assert (linear.in_features, linear.out_features) == (64 * 4 * 4, 256)
    obs = {"rgb": torch.full((2, 64, 64, 3), 255, dtype=torch.uint8), "state": torch.zeros(2, 4)}
    out = cnn(obs)
    assert out.shape == (2, 512) and cnn.out_features == 512
    scaled = cnn.cnn(torch.ones(2, 3, 64, 64))  # 255 is 1.0 to the convolutions
    torch.testing.assert_close(out[:, :256], scaled)
    assert NatureCNN({"rgb": (36, 36, 3)})({"rgb": obs["rgb"][:, :36, :36]}).shape == (2, 256)
    agent = ActorCritic(_space(64, 64), gym.spaces.Box(-1, 1, (2,)), [32], encoder="cnn")
    action, logp, value = agent.act_with_noise(obs, torch.randn(2, 2))
    assert action.shape == (2, 2) and logp.shape == value.shape == (2,)
    # one encoder, shared by the heads; the critic alone is clipped as the critic
    assert not any(p is q for p in agent.critic.parameters() for q in agent.encoder.parameters())


def test_state_only_models_keep_their_checkpoint_keys():
    """A checkpoint written before encoders existed loads: the MLP path adds no parameter."""
    agent = ActorCritic(gym.spaces.Box(-1, 1, (6,)), gym.spaces.Box(-1, 1, (2,)), [64, 64])
    keys = {
        f"{n}.{i}.{p}" for n in ("actor", "critic") for i in (0, 2, 4) for p in ("weight", "bias")
    }
    assert set(agent.state_dict()) == {"log_std", *keys}


def test_the_normaliser_sees_the_state_alone():
    norm = ObsNormalizer((4,))
    rgb = torch.randint(0, 256, (8, 36, 36, 3), dtype=torch.uint8)
    obs = {"rgb": rgb, "state": torch.randn(8, 4) * 5 + 3}
    norm.update(obs)
    out = norm(obs)
    assert out["rgb"] is obs["rgb"]
    torch.testing.assert_close(out["state"].mean(0), torch.zeros(4), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "args,says",
    [
        (["algo.encoder=cnn"], "env=builtin observes a flat state vector: set env.obs_mode=rgb or"),
        (["env=gymnasium", "algo.encoder=cnn"], "env=gymnasium observes a flat state vector: set"),
        # an id that is not registered: the registry's refusal, not the encoder's
        (
            ["env=gymnasium", "env.id=CartPol-v1", "algo.encoder=cnn"],
            "env.id='CartPol-v1' is not a registered gymnasium id: did you mean CartPole-v1",
        ),
        (["env.obs_mode=rgb", "env.obs_width=35", "algo.encoder=cnn"], "too small for NatureCNN"),
        (["env.obs_mode=rgb", "env.obs_width=128"], "algo.encoder=mlp on the raw image 64x128x3"),
    ],
)
def test_encoders_that_cannot_read_the_observation_are_refused(args, says):
    with pytest.raises(ConfigError, match=says):
        make_config(args)


def test_the_estimate_counts_the_images():
    from rlrec.run import budget

    args = ["env.num_envs=4096", "env.obs_mode=rgb_state", "algo.encoder=cnn", "algo.num_steps=50"]
    needs = {n.what: n for n in budget.estimate(make_config(args))}
    images = needs["the observed images (uint8) and an epoch's shuffled copy"]
    assert images.bytes == 4096 * 50 * 64 * 64 * 3 * 2
    assert "env.obs_height x env.obs_width" in images.keys and "64x64x3" in images.keys
    assert "algo.encoder=cnn on 64x64x3" in needs["the activations of one update minibatch"].keys


def test_a_pixel_run_that_cannot_fit_is_refused_naming_the_image(monkeypatch):
    from rlrec.run import budget

    monkeypatch.setattr(budget, "host_memory", lambda: (10**9, "a test's 1 GB"))
    cfg = make_config(["env.num_envs=4096", "env.obs_mode=rgb", "algo.encoder=cnn"])
    with pytest.raises(ConfigError, match=r"the observed images \(uint8\).*64x64x3.*GB"):
        budget.check(cfg)
