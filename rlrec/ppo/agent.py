"""Actor-critic models: a Gaussian policy for Box actions, a categorical one for Discrete, over
a state vector or an image observation (rlrec/obs.py) read by an encoder (``algo.encoder``)."""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from rlrec.obs import RGB, STATE, Obs, Shape, shape_of
from rlrec.ppo.config import CNN_FEATURES, CNN_LAYERS, Init, ObsEncoder, PPOConfig, cnn_maps

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


class ObsNormalizer(nn.Module):
    """Running mean/std of observations (batched Welford update), saved in checkpoints.

    ``pending=True`` (a run of several ranks) also keeps the count, sum and sum of squares (float64)
    of the observations seen since the last :meth:`merge_pending`, which merges those of every rank
    into the statistics as of the last merge, so that every rank holds the same statistics."""

    clip, eps = 10.0, 1e-8  # the bound of a normalised value; the variance's floor, the first count

    def __init__(self, shape: Tuple[int, ...], pending: bool = False):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(self.eps, dtype=torch.float64))
        # ``pending``: non-persistent buffers (checkpoints hold mean, var and count alone), so
        # ``.to(device)`` moves them with the statistics and they are never rebuilt: a tensor
        # built inside the rollout's ``torch.inference_mode()`` could not be updated in place by
        # the merge outside it ("Inplace update to inference tensor outside InferenceMode").
        # Each is [count, mean or sum..., var or sum of squares...] in float64: ``_pending`` of
        # the observations since the last merge, ``_base`` the statistics as of that merge
        for name in ("_pending", "_base"):
            value = torch.zeros(1 + 2 * int(np.prod(shape)), dtype=torch.float64)
            self.register_buffer(name, value if pending else None, persistent=False)
        if pending:
            self._rebase()

    def _rebase(self):
        """The statistics as of now are what the next merge starts from (copied in place: the
        buffers stay the tensors they are, whatever the grad mode of the caller)."""
        self._base.copy_(torch.cat([self.count.view(1), self.mean.flatten(), self.var.flatten()]))
        self._pending.zero_()

    def update(self, x):
        x = x[STATE] if isinstance(x, dict) else x  # an image's values are never normalised
        n = x.shape[0]
        if self._pending is not None:  # [count, sum..., sum of squares...]
            xd = x.double().reshape(n, -1)
            self._pending += torch.cat([xd.new_full((1,), n), xd.sum(0), (xd * xd).sum(0)])
        stats = _merged(self.count, self.mean, self.var, n, x.mean(0), x.var(0, unbiased=False))
        self._set(*stats)

    def merge_pending(self, all_reduce: Callable) -> None:
        """Merges every rank's observations since the last merge (``all_reduce`` sums the pending
        moments over the ranks, in place: one all-reduce) into the statistics as of the last
        merge (Chan's parallel update, in float64). A no-op without ``pending``."""
        if self._pending is None:
            return
        pending = all_reduce(self._pending)
        n = pending[0]
        if float(n) > 0:
            k = self.mean.numel()
            base, mean = self._base, pending[1 : 1 + k] / n
            var = (pending[1 + k :] / n - mean**2).clamp_min(0.0)
            self._set(*_merged(base[0], base[1 : 1 + k], base[1 + k :], n, mean, var))
        self._rebase()

    def _set(self, count, mean, var):
        self.mean.copy_(mean.view_as(self.mean))
        self.var.copy_(var.view_as(self.var))
        self.count.copy_(count)

    def _load_from_state_dict(self, *args, **kwargs):  # type: ignore[override]
        super()._load_from_state_dict(*args, **kwargs)
        if self._pending is not None:
            self._rebase()

    def forward(self, x):
        if isinstance(x, dict):  # the state part alone
            return {**x, STATE: self(x[STATE])}
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)


def _merged(count, mean, var, n, batch_mean, batch_var):
    """``(count, mean, var)`` of the observations of the statistics ``count, mean, var`` and of
    a batch of ``n`` with ``batch_mean, batch_var`` (Chan's parallel update; in the dtype of
    ``mean``, float32 with a float64 ``count`` for one process's running statistics)."""
    total = count + n
    delta = batch_mean - mean
    m2 = var * count + batch_var * n + delta**2 * (count * n / total)
    return total, mean + delta * (n / total), m2 / total


def _mlp(sizes, activation, out_gain, init):
    """An MLP; ``init="orthogonal"``: orthogonal weights (gain sqrt(2), ``out_gain`` for the
    output layer) and zero biases; ``"torch_default"``: ``nn.Linear``'s own init, untouched
    (:class:`~rlrec.ppo.config.Init`, which refuses any other value)."""
    init = Init(init)
    layers: List[nn.Module] = []
    for i in range(len(sizes) - 1):
        layer = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        if init is Init.orthogonal:
            nn.init.orthogonal_(layer.weight, out_gain if last else np.sqrt(2))
            nn.init.constant_(layer.bias, 0.0)
        layers.append(layer)
        if not last:
            layers.append(_ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


class Flatten(nn.Module):
    """``algo.encoder=mlp``: the observation of ``shape`` (rlrec/obs.py) flattened (no parameters:
    the checkpoints of state-only runs hold the same keys as before encoders); an image scaled to
    [0, 1] and joined with the state."""

    def __init__(self, shape: Shape):
        super().__init__()
        parts = shape.values() if isinstance(shape, dict) else [shape]
        self.out_features = sum(int(np.prod(p)) for p in parts)

    def forward(self, obs):
        if not isinstance(obs, dict):
            return obs.flatten(1)
        image = obs[RGB].flatten(1).float() / 255.0
        return torch.cat([image, obs[STATE]], dim=1) if STATE in obs else image


class NatureCNN(nn.Module):
    """``algo.encoder=cnn``: ManiSkill's NatureCNN (the class ``NatureCNN`` of
    examples/baselines/ppo/ppo_rgb.py at haosulab/ManiSkill 07bc2dd): convolutions 8/4, 4/2, 3/1
    with ReLUs, flattened, a linear layer to 256 with a ReLU; the state through its own linear
    layer to 256; the two joined. The uint8 image is scaled to [0, 1] here, on the device.
    ``shape``: the observation's (rlrec/obs.py), an image with or without a state."""

    def __init__(self, shape: Dict[str, Tuple[int, ...]]):
        super().__init__()
        height, width, channels = shape[RGB]
        state_dim = int(np.prod(shape[STATE])) if STATE in shape else 0
        layers: List[nn.Module] = []
        for out, kernel, stride in CNN_LAYERS:
            layers += [nn.Conv2d(channels, out, kernel, stride), nn.ReLU()]
            channels = out
        _, h, w = cnn_maps(height, width)[-1]
        self.cnn = nn.Sequential(
            *layers, nn.Flatten(), nn.Linear(channels * h * w, CNN_FEATURES), nn.ReLU()
        )
        self.state = nn.Linear(state_dim, CNN_FEATURES) if state_dim else None
        self.out_features = CNN_FEATURES * (2 if state_dim else 1)

    def forward(self, obs):
        x = self.cnn(obs[RGB].permute(0, 3, 1, 2).float() / 255.0)
        return x if self.state is None else torch.cat([x, self.state(obs[STATE])], dim=1)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (CleanRL layout) over the encoder's features: the flattened
    observation, or NatureCNN's (``encoder=cnn``, shared by both heads as in ppo_rgb.py)."""

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: List[int],
        activation: str = "tanh",
        init_log_std: float = 0.0,
        init: str = PPOConfig.init,  # algo.init's default (the schema holds it)
        encoder: str = PPOConfig.encoder,
    ):
        super().__init__()
        shape = shape_of(obs_space)  # a CNN's: an image (refused before work otherwise)
        self.encoder = NatureCNN(shape) if ObsEncoder(encoder) is ObsEncoder.cnn else Flatten(shape)
        obs_dim = self.encoder.out_features
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if self.discrete:
            act_dim = int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box):
            act_dim = int(np.prod(action_space.shape))
        else:
            raise TypeError(f"unsupported action space {action_space}: Box or Discrete only")
        self.action_shape = () if self.discrete else tuple(action_space.shape)
        self.critic = _mlp([obs_dim, *hidden_sizes, 1], activation, 1.0, init)
        self.actor = _mlp([obs_dim, *hidden_sizes, act_dim], activation, 0.01, init)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))

    def value(self, obs: Obs, features=None) -> torch.Tensor:
        return self.critic(self.encoder(obs) if features is None else features).squeeze(-1)

    def distribution(self, obs: Obs, features=None):
        out = self.actor(self.encoder(obs) if features is None else features)
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def _log_softmax(self, features):
        """Categorical log-probabilities of every action: the discrete head's one tensor, from
        which sampling, log-prob and entropy are read (fewer ops than a Categorical per call)."""
        return torch.log_softmax(self.actor(features), dim=-1)

    def noise_shape(self, batch: int):
        """The shape of the noise :meth:`act_with_noise` takes for a batch of ``batch`` obs."""
        return (batch, self.actor[-1].out_features)  # the logits, or the mean of each dimension

    def act_with_noise(self, obs: Obs, noise):
        """``(action, log_prob, value)`` for a batch of (normalised) observations, with the
        randomness passed in, so the whole step is one graph for ``torch.compile`` (no random op
        inside it) and the caller's generator draws it.

        Gaussian head: ``noise`` is standard normal and the action ``mean + std * noise``, which is
        what ``Normal(mean, std).sample()`` computes from the same draw (``torch.randn``), so a
        compiled rollout takes the same actions as an eager one. Categorical head: ``noise`` is
        uniform in [0, 1) and the action the Gumbel-max sample ``argmax(logp + Gumbel(noise))``
        (the categorical distribution, but not the numbers ``torch.multinomial`` draws)."""
        f = self.encoder(obs)  # once, for both heads
        if self.discrete:
            logp = self._log_softmax(f)
            tiny = torch.finfo(logp.dtype).tiny
            gumbel = -torch.log(-torch.log(noise.clamp(tiny, 1.0 - 1e-7)))
            action = (logp + gumbel).argmax(-1)
            log_prob = logp.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        else:
            mean = self.actor(f)
            std = self.log_std.exp().expand_as(mean)
            action = mean + std * noise
            # Normal(mean, std).log_prob(action), written out with the same operations
            log_prob = (-((action - mean) ** 2) / (2 * std**2) - std.log() - _LOG_SQRT_2PI).sum(-1)
        return action, log_prob, self.value(obs, f)

    def action(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        """The action for a batch of (normalised) observations (evaluation): the mode when
        ``deterministic``, else a sample; no critic pass."""
        f = self.encoder(obs)
        if deterministic:  # the mode, straight from the actor's output
            out = self.actor(f)
            return out.argmax(-1) if self.discrete else out
        if self.discrete:  # what Categorical.sample does
            return torch.multinomial(self._log_softmax(f).exp(), 1, True).squeeze(-1)
        return self.distribution(obs, f).sample()

    def evaluate(self, obs: Obs, action):
        """``(log_prob, entropy, value)`` of given actions, for the PPO loss."""
        f = self.encoder(obs)
        if self.discrete:
            logp = self._log_softmax(f)
            log_prob = logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            return log_prob, -(logp.exp() * logp).sum(-1), self.value(obs, f)
        dist = self.distribution(obs, f)
        return dist.log_prob(action).sum(-1), dist.entropy().sum(-1), self.value(obs, f)
