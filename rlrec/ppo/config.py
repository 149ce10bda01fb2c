"""PPO's settings (the ``algo`` group's schema) and its closed choices."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from rlrec.checks import NON_NEGATIVE, POSITIVE, UNIT, Choice, ConfigError, Range


class Activation(Choice):
    """Hidden-layer activation of the policy and value MLPs."""

    tanh = "tanh"
    relu = "relu"
    elu = "elu"


class BootstrapAt(Choice):
    """Which episode ends PPO bootstraps from ``V(final_obs)`` (every other end adds nothing).
    ``truncated``: time-outs only; a termination is a true end (a fall, a crash) worth no future.
    ``done``: every end, termination included, as ManiSkill's PPO baselines do (their tasks
    terminate on success, and a success is then worth its reward plus the value of the state it
    reached, not less than lingering beside the goal). docs/maniskill.md says when to use which."""

    truncated = "truncated"
    done = "done"


class KLCheck(Choice):
    """When ``algo.target_kl`` is checked. ``epoch``: after each epoch, on its last minibatch's KL
    (CleanRL; one device sync per epoch). ``minibatch``: before each minibatch's optimizer step,
    which that minibatch then skips (ManiSkill's ppo.py; one device sync per minibatch)."""

    epoch = "epoch"
    minibatch = "minibatch"


class GradClip(Choice):
    """How ``algo.max_grad_norm`` clips the gradient. ``joint``: one norm over every parameter,
    actor and critic together (CleanRL, Stable-Baselines3). ``per_network``: the actor's
    parameters (its std included) and the critic's each clipped to it on their own (rsl_rl's
    PPO), so a large value-loss gradient does not shrink the policy's step."""

    joint = "joint"
    per_network = "per_network"


class Init(Choice):
    """How the policy's and the value's MLP weights start. ``orthogonal``: orthogonal weights
    with gain sqrt(2) in the hidden layers, 0.01 in the actor's output layer and 1 in the
    critic's, zero biases (CleanRL, Stable-Baselines3, ManiSkill's baselines). ``torch_default``:
    ``nn.Linear``'s own init (uniform weights and biases in +-1/sqrt(fan_in)), as rsl_rl's MLP
    keeps it."""

    orthogonal = "orthogonal"
    torch_default = "torch_default"


class ObsEncoder(Choice):
    """What reads the observation before the actor's and the critic's MLPs. ``mlp``: nothing (the
    observation flattened; an image scaled to [0, 1], within MLP_IMAGE_LIMIT values). ``cnn``:
    ManiSkill ppo_rgb.py's NatureCNN over the image (``rlrec.ppo.agent.NatureCNN``), the state
    through its own linear layer, joined before the heads (image observations only)."""

    mlp = "mlp"
    cnn = "cnn"


MLP_IMAGE_LIMIT = 64 * 64 * 3  # values of an image an MLP reads raw; beyond it: algo.encoder=cnn
CNN_LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # NatureCNN's convolutions: out, kernel, stride
CNN_FEATURES = 256  # NatureCNN's linear layers' outputs: the image's, and the state's


def cnn_maps(height: int, width: int) -> List[Tuple[int, int, int]]:
    """``(channels, height, width)`` of each of NatureCNN's feature maps for an image of
    ``height x width`` (the model's layers, its checks and the memory estimate read them)."""
    maps = []
    for out, kernel, stride in CNN_LAYERS:
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        maps.append((out, height, width))
    return maps


def check_encoder(encoder: str, env: Any, key: str) -> None:
    """ConfigError, before work, for an encoder that cannot read the observation of ``env`` (its
    schema, an ``rlrec.envs.config.EnvConfig``): a CNN on a state-only env, an image too small for
    the CNN's strides, an MLP on a large raw image."""
    image = env.obs_image()
    if image is None:
        if encoder == ObsEncoder.cnn:  # every backend observes images (env.obs_mode)
            raise ConfigError(
                f"{key}=cnn reads an image but env={env.name} observes a flat state vector: set "
                "env.obs_mode=rgb or rgb_state, or set algo.encoder=mlp"
            )
        return
    h, w, c = image
    if min(image) < 1:
        raise ConfigError(f"env.obs_height x env.obs_width = {h}x{w}: an image needs pixels")
    if encoder == ObsEncoder.cnn and min(cnn_maps(h, w)[-1][1:]) < 1:
        raise ConfigError(
            f"{key}=cnn: the observed image {h}x{w} (env.obs_height x env.obs_width) is too small "
            "for NatureCNN's convolutions (kernels 8, 4, 3, strides 4, 2, 1): 36x36 at least"
        )
    if encoder == ObsEncoder.mlp and h * w * c > MLP_IMAGE_LIMIT:
        raise ConfigError(
            f"{key}=mlp on the raw image {h}x{w}x{c} = {h * w * c} values (env.obs_height x "
            f"env.obs_width x channels): more than {MLP_IMAGE_LIMIT}; use algo.encoder=cnn or a "
            "smaller image"
        )


@dataclass
class PPOConfig:
    """PPO hyper-parameters (CleanRL names)."""

    # the range of each float field, applied by rlrec.checks.check_fields (not a field)
    FLOAT_RANGES = {
        "learning_rate": POSITIVE,
        "gamma": UNIT,
        "gae_lambda": UNIT,
        "clip_coef": POSITIVE,
        "ent_coef": NON_NEGATIVE,
        "vf_coef": NON_NEGATIVE,
        "max_grad_norm": POSITIVE,
        "target_kl": POSITIVE,
        "reward_scale": POSITIVE,
        # the initial std is exp(init_log_std): beyond +-20 it is 0 or overflows in float32 math
        "init_log_std": Range(low=-20.0, high=20.0),
        "adam_eps": POSITIVE,
        "clip_reward": POSITIVE,
    }

    name: str = "ppo"
    num_steps: int = 32  # rollout length per env
    learning_rate: float = 3e-4
    # Adam's eps: torch's default, as rsl_rl's PPO (CleanRL, SB3 and ManiSkill's baselines: 1e-5)
    adam_eps: float = 1e-8
    # the learning rate annealed linearly to 0 over total_steps (CleanRL); off: fixed (rsl_rl's
    # schedule=fixed)
    anneal_lr: bool = False
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    anneal_clip: bool = False  # clip range annealed with the learning rate (SB3's lin_0.2)
    clip_vloss: bool = False
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    # per_network (actor and critic each on its own, rsl_rl's) | joint (CleanRL's, SB3's):
    # per network reaches 0.95 training success on the built-in env in fewer env steps
    # (scripts/bench_rsl_rl.py)
    grad_clip: GradClip = GradClip.per_network
    target_kl: Optional[float] = 0.1
    kl_check: KLCheck = KLCheck.epoch  # epoch | minibatch (ManiSkill's: before each step)
    # which episode ends add gamma * V(final_obs): truncated (time-outs) | done (every end)
    bootstrap_at: BootstrapAt = BootstrapAt.truncated
    norm_obs: bool = True
    reward_scale: float = 1.0
    hidden_sizes: List[int] = field(default_factory=lambda: [64, 64])
    init_log_std: float = 0.0
    activation: Activation = Activation.tanh
    # torch_default (nn.Linear's, as rsl_rl's MLP) | orthogonal (CleanRL's, SB3's, ManiSkill's).
    # With the fixed learning rate and Adam eps 1e-8: 0.95 training success on the built-in env
    # in as few env steps as rsl_rl's PPO (scripts/bench_rsl_rl.py)
    init: Init = Init.torch_default
    # mlp (the observation flattened) | cnn (NatureCNN over an image observation, ppo_rgb.py's)
    encoder: ObsEncoder = ObsEncoder.mlp
    # torch.compile of the policy step and of the update step (CUDA graphs on CUDA); docs/gpu.md
    compile: bool = False
    # each reward divided by the running std of its env's discounted return (gamma), after
    # reward_scale: Gymnasium's NormalizeReward, as CleanRL's MuJoCo PPO (docs/gymnasium.md)
    norm_reward: bool = False
    clip_reward: Optional[float] = None  # rewards clipped to +-clip_reward, last (CleanRL: 10)
