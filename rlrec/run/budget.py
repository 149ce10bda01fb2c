"""The memory a run needs, estimated from its config before anything is built, against the memory
the machine has: a size that cannot fit (``env.num_envs=100000000``) is refused naming its keys,
instead of dying in the allocator with a traceback after the run dir is made.

The estimate is a lower bound of rlrec's own large allocations, so that nothing that could fit is
refused: a state and an action count as one float each (their real sizes are known only once the
env is built), frames only where their size comes from ``env.render_width`` and
``env.render_height``. The simulator's and the renderer's own memory is not counted (the refusal
says so). It counts, on the sim device unless said otherwise,

- the rollout storage: ``num_steps x num_envs`` rows of observation, action, log-prob, reward,
  done, value, advantage and return (``rlrec.ppo.storage``); an observed image
  (``env.obs_image()``) as uint8, twice (the storage and an epoch's shuffled copy; once with one
  minibatch);
- the model: the encoder (``algo.encoder=cnn``: NatureCNN's parameters) and the actor and critic
  MLPs, with their gradients and Adam's two moments (4 copies of the parameters);
- the activations of one update minibatch (``num_steps x num_envs / num_minibatches`` rows) and
  of one action step (``num_envs`` rows, or the eval env's), each row through the encoder (the
  image as floats; NatureCNN's feature maps) and every hidden layer of both MLPs. The bootstrap
  pass (the value of the final and the last observations) runs after the action step in its
  memory; with ``algo.compile`` on CUDA, whose CUDA graphs keep their memory, it counts on its
  own, with the graphs' copies of their inputs (the policy step's observations and noise, one
  minibatch);
- per recorder: the frame buffers of its encoder queue (``queue_size`` frames of the recorded
  envs, in host memory) and one render of them.

Host memory is the physical memory (``os.sysconf``: ``MemTotal`` of ``/proc/meminfo`` on Linux),
lowered to the cgroup limit of a container or batch job. GPU memory is the device's free memory
(``torch.cuda.mem_get_info``: what every process on it has left), divided among the ranks of the
node that share it (``distributed.share_gpus``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from rlrec import distributed
from rlrec.checks import ConfigError
from rlrec.config import Config
from rlrec.envs.config import ObsMode
from rlrec.ppo.config import CNN_FEATURES, CNN_LAYERS, ObsEncoder, cnn_maps
from rlrec.record.settings import recording

FLOAT = 4  # bytes of a float32
ROLLOUT_FLOATS = 8  # obs (>= 1), action (>= 1), logprob, reward, done, value, advantage, return
PARAM_COPIES = 4  # weights, gradients, Adam's exp_avg and exp_avg_sq


@dataclass
class Need:
    """One large allocation: what it is, the keys (with their values) that size it, its bytes and
    where it lives (``host`` or ``device``)."""

    what: str
    keys: str
    bytes: int
    where: str


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _encoder(env, encoder: ObsEncoder) -> Tuple[int, int, int, str]:
    """``(parameters, features, floats, keys)`` of what reads the observation (rlrec.ppo.agent's
    ``Flatten`` or ``NatureCNN``): the features its MLPs read and the activation floats it keeps
    per row (the image as floats; NatureCNN's feature maps and features). A state counts one
    float (its size is known once the env is built)."""
    image = env.obs_image()
    if image is None:
        return 0, 1, 0, ""  # the state, flattened: a view
    h, w, c = image
    state = int(env.obs_mode == ObsMode.rgb_state)
    keys = f"algo.encoder={encoder} on {h}x{w}x{c} (env.obs_height x env.obs_width x channels)"
    if encoder != ObsEncoder.cnn:  # the image as floats in [0, 1], joined with the state
        return 0, h * w * c + state, h * w * c + state, keys
    maps = cnn_maps(h, w)
    ins = [c] + [out for out, _, _ in maps[:-1]]
    params = sum(out * (cin * k * k + 1) for (out, k, _), cin in zip(CNN_LAYERS, ins))
    params += (maps[-1][0] * maps[-1][1] * maps[-1][2] + 1) * CNN_FEATURES  # to the features
    params += state * (1 + 1) * CNN_FEATURES  # the state's own linear layer
    features = CNN_FEATURES * (1 + state)
    floats = h * w * c + sum(out * mh * mw for out, mh, mw in maps) + features
    return params, features, floats, keys


def estimate(cfg: Config, on_gpu: bool = False) -> List[Need]:
    """The large allocations of a run of ``cfg`` (a lower bound of each), largest first."""
    a, env = cfg.algo, cfg.env
    device = "device" if on_gpu else "host"
    hidden = [int(h) for h in a.hidden_sizes]
    enc_params, features, floats, encoder = _encoder(env, a.encoder)
    model = f"algo.hidden_sizes={hidden}" + (f", {encoder}" if encoder else "")
    mlps = f"(algo.hidden_sizes={hidden} x 2 MLPs" + (
        f" + {floats} floats, {encoder})" if encoder else ")"
    )
    row = (sum(hidden) * 2 + floats) * FLOAT  # one row's activations: the encoder and both MLPs
    training = not cfg.eval_only
    sizes = [features, *hidden, 1]  # actor and critic, one output each
    params = enc_params + 2 * sum(x * y + y for x, y in zip(sizes[:-1], sizes[1:]))
    copies = PARAM_COPIES if training else 1  # evaluation: no gradients, no Adam state
    what = "the model with its gradients and Adam state" if training else "the model"
    needs = [Need(what, model, params * copies * FLOAT, device)]
    steps = [("eval_env.num_envs", int(cfg.eval_env.num_envs))]
    if training:
        # algo.compile on CUDA runs CUDA graphs (rlrec.ppo.ppo.COMPILE_MODES); the bootstrap
        # pass's bytes per row: the encoder and the critic
        graphs = (sum(hidden) + floats) * FLOAT if on_gpu and a.compile else 0
        needs += _rollout_and_update(cfg, row, mlps, device, graphs)
        steps.insert(0, ("env.num_envs", int(env.num_envs)))
    key, n = max(steps, key=lambda s: s[1])
    # eager, the bootstrap pass (the value of the final and last observations) reuses its memory
    what = "the activations of one action step (and of its bootstrap pass)"
    needs.append(Need(what, f"{key}={n} rows x {mlps}", n * row, device))
    return sorted(needs + _recorders(cfg, training, device), key=lambda n: n.bytes, reverse=True)


def _rollout_and_update(cfg: Config, row: int, mlps: str, device: str, graphs: int) -> List[Need]:
    """The rollout storage, its images and an update minibatch's activations; with CUDA graphs
    (``graphs``: the bytes per row of the bootstrap pass, else 0) the graphs' copies of their
    inputs (torch/_inductor/cudagraph_trees.py ``_allocate_and_copy_recording_inputs``: every
    input but parameters and earlier graphs' outputs) and the bootstrap pass, which runs eagerly
    beside the policy step's graph memory."""
    a, env = cfg.algo, cfg.env
    n = int(env.num_envs)
    rows = n * int(a.num_steps)
    batch = f"env.num_envs={n} x algo.num_steps={a.num_steps}"
    storage = f"{batch} x {ROLLOUT_FLOATS} floats"
    needs = [Need("the rollout storage", storage, rows * ROLLOUT_FLOATS * FLOAT, device)]
    image, obs = env.obs_image(), FLOAT  # bytes of an observation: a state of at least 1 float
    if image is not None:
        h, w, c = image
        obs = h * w * c + FLOAT * int(env.obs_mode == ObsMode.rgb_state)
        pixels = f"{batch} x {h}x{w}x{c} (env.obs_height x env.obs_width x channels)"
        copies = 2 if int(a.num_minibatches) > 1 else 1  # one minibatch: no shuffled copy
        what = "the observed images (uint8)" + (" and an epoch's shuffled copy" * (copies - 1))
        needs.append(Need(what, f"{pixels} x {copies} bytes", rows * h * w * c * copies, device))
    mb = rows // max(1, int(a.num_minibatches))
    per = f"{batch} / algo.num_minibatches={a.num_minibatches} rows"
    what = "the activations of one update minibatch"
    needs.append(Need(what, f"{per} x {mlps}", mb * row, device))
    if graphs:
        what = "the CUDA-graph copies of the policy step's inputs"
        keys = f"env.num_envs={n} x (observation, noise)"
        needs.append(Need(what, keys, n * (obs + FLOAT), device))
        what, keys = "the CUDA-graph copies of one minibatch", f"{per} x (observation + 5 floats)"
        needs.append(Need(what, keys, mb * (obs + 5 * FLOAT), device))
        what = "the activations of the bootstrap pass (eager, beside the CUDA graphs)"
        needs.append(Need(what, f"env.num_envs={n} rows x (encoder + critic)", n * graphs, device))
    return needs


def _recorders(cfg: Config, training: bool, device: str) -> List[Need]:
    """Per recorder: its encoder queue's frame buffers (host) and one render (the sim device)."""
    env, needs = cfg.env, []
    frame_size = env.frame_size()  # None: the env chooses it (gymnasium: without resize_frames)
    if frame_size is None:
        return needs
    frame = int(frame_size[0]) * int(frame_size[1]) * 3  # bytes of one env's frame
    size = f"env.render_width={env.render_width} x env.render_height={env.render_height}"
    recorders = [(cfg.recorder, "recorder")] if training else []
    if cfg.eval_env.enabled or cfg.eval_only:
        recorders.append((cfg.eval_env.recorder, "eval_env.recorder"))
    for rec, key in recorders:
        if not recording(rec):
            continue
        renders = frame * len(rec.env_idx)  # both: the obs tile beside it, built on the host
        n = len(rec.env_idx) * (2 if rec.view == "both" else 1)
        queue = f"{key}.queue_size={rec.queue_size} x {n} tiles ({key}.env_idx, view) x {size}"
        what = f"the frame buffers of the {key} queue"
        needs.append(Need(what, f"{queue} x 3 bytes", int(rec.queue_size) * frame * n, "host"))
        needs.append(Need(f"one render of the {key}", size, renders, device))
    return needs


# --------------------------------------------------------------------------- what the machine has


def host_memory() -> Tuple[Optional[int], str]:
    """Bytes of host memory this process can have, and where that figure comes from: the memory
    limit of its cgroup (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``) where one is below
    the physical memory."""
    try:  # on Linux what /proc/meminfo calls MemTotal
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None, "unknown"
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < total:  # "max" or a huge number: no limit
            return int(text), "the cgroup memory limit"
    return total, "the physical memory (os.sysconf)"


def device_memory(device) -> Tuple[Optional[int], str]:
    """The free bytes of the CUDA device ``device`` (what every process on it has not taken), this
    rank's share where several ranks of the node use it (``distributed.share_gpus``); None when
    it cannot be asked."""
    import torch

    try:  # (free, total), the whole device's: cudaMemGetInfo (torch/cuda/memory.py)
        free, total = torch.cuda.mem_get_info(device)
    except (RuntimeError, AssertionError, ValueError):
        return None, "unknown"
    ranks = distributed.ranks_sharing(device)
    source = f"free of {gb(total)} on {device}, torch.cuda.mem_get_info"
    if ranks > 1:
        source += f"; {gb(free)} shared by the {ranks} ranks on it (distributed.share_gpus)"
    return int(free) // ranks, source


# --------------------------------------------------------------------------- the check


def check(cfg: Config, device=None) -> None:
    """ConfigError naming the keys of the largest allocations when the run's estimate exceeds the
    host memory or (sim on a CUDA device) the GPU memory free for this rank. Allocates nothing."""
    on_gpu = device is not None and getattr(device, "type", str(device)).startswith("cuda")
    needs = estimate(cfg, on_gpu)
    places = [("host", "host memory", host_memory)]
    if on_gpu:
        places.append(("device", f"GPU memory ({device})", lambda: device_memory(device)))
    for where, label, have in places:
        mine = [n for n in needs if n.where == where]
        total = sum(n.bytes for n in mine)
        available, source = have()
        if available is None or total <= available:
            continue
        big = [n for n in mine if n.bytes >= 0.05 * total] or mine[:1]
        parts = "; ".join(f"{n.what}: {n.keys} = {gb(n.bytes)}" for n in big)
        raise ConfigError(
            f"this run needs at least {gb(total)} of {label} but has {gb(available)} "
            f"({source}): {parts}. Not counted: the simulator's and the renderer's own memory. "
            "Lower the keys named."
        )
