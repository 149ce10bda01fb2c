"""The memory a run needs, estimated from its config before anything is built, against the memory
the machine has: a size that cannot fit (``env.num_envs=100000000``) is refused naming its keys,
instead of dying in the allocator with a traceback after the run dir is made.

The estimate is a lower bound of the large allocations only, so that nothing that could fit is
refused: observations and actions count as one float each (their real sizes are known only once
the env is built), frames only where their size comes from ``env.render_width`` and
``env.render_height``. It counts

- the rollout storage: ``num_steps x num_envs`` rows of observation, action, log-prob, reward,
  done, value, advantage and return (``rlrec.ppo.storage``), on the sim device; an observed image
  (``env.obs_image()``) as uint8, twice (the storage and an epoch's shuffled copy; once with one
  minibatch), and with ``algo.encoder=cnn`` the CNN's activations of one update minibatch;
- the model: actor and critic MLPs with their gradients and Adam's two moments (4 copies of the
  parameters), on the sim device;
- the activations of one update minibatch (``num_steps x num_envs / num_minibatches`` rows through
  every hidden layer of both MLPs) and of one action step (``num_envs`` rows), on the sim device;
- per recorder: the frame buffers of its encoder queue (``queue_size`` frames of the recorded
  envs, in host memory) and one render of them (on the sim device).

Host memory is the physical memory (``os.sysconf``: ``MemTotal`` of ``/proc/meminfo`` on Linux),
lowered to the cgroup limit of a container or batch job; GPU memory is the device's total
(``torch.cuda.mem_get_info``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from rlrec.checks import ConfigError
from rlrec.config import Config
from rlrec.ppo.config import Encoder, cnn_maps
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


def estimate(cfg: Config, on_gpu: bool = False) -> List[Need]:
    """The large allocations of a run of ``cfg`` (a lower bound of each), largest first."""
    a, env = cfg.algo, cfg.env
    device = "device" if on_gpu else "host"
    hidden = [int(h) for h in a.hidden_sizes]
    hidden_keys = f"algo.hidden_sizes={hidden}"
    mlps = f"{hidden_keys} x 2 MLPs"
    row = sum(hidden) * 2 * FLOAT  # bytes of one row's activations through both MLPs
    training = not cfg.eval_only
    sizes = [1, *hidden, 1]  # actor and critic, one input and one output each
    params = 2 * sum(x * y + y for x, y in zip(sizes[:-1], sizes[1:]))
    copies = PARAM_COPIES if training else 1  # evaluation: no gradients, no Adam state
    what = "the model with its gradients and Adam state" if training else "the model"
    needs = [Need(what, hidden_keys, params * copies * FLOAT, device)]
    steps = [("eval_env.num_envs", int(cfg.eval_env.num_envs))]
    if training:
        rows = int(env.num_envs) * int(a.num_steps)
        batch = f"env.num_envs={env.num_envs} x algo.num_steps={a.num_steps}"
        storage = f"{batch} x {ROLLOUT_FLOATS} floats"
        needs.append(Need("the rollout storage", storage, rows * ROLLOUT_FLOATS * FLOAT, device))
        image = env.obs_image()
        if image is not None:
            h, w, c = image
            pixels = f"{batch} x {h}x{w}x{c} (env.obs_height x env.obs_width x channels)"
            copies = 2 if int(a.num_minibatches) > 1 else 1  # one minibatch: no shuffled copy
            what = "the observed images (uint8)" + (" and an epoch's shuffled copy" * (copies - 1))
            needs.append(
                Need(what, f"{pixels} x {copies} bytes", rows * h * w * c * copies, device)
            )
        rows //= max(1, int(a.num_minibatches))
        per = f"{batch} / algo.num_minibatches={a.num_minibatches} rows"
        needs.append(
            Need("the activations of one update minibatch", f"{per} x {mlps}", rows * row, device)
        )
        if image is not None and a.encoder == Encoder.cnn:
            # per row: the scaled image and each convolution's output
            floats = h * w * c + sum(out * mh * mw for out, mh, mw in cnn_maps(h, w))
            what, keys = "the CNN activations of one update minibatch", f"{per} x {floats} floats"
            needs.append(Need(what, keys, rows * floats * FLOAT, device))
        steps.insert(0, ("env.num_envs", int(env.num_envs)))
    key, step_envs = max(steps, key=lambda s: s[1])
    action = f"{key}={step_envs} rows x {mlps}"
    needs.append(Need("the activations of one action step", action, step_envs * row, device))
    frame_size = env.frame_size()  # None: the env chooses it (gymnasium: without resize_frames)
    if frame_size is not None:
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
    return sorted(needs, key=lambda n: n.bytes, reverse=True)


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
    """Total bytes of the CUDA device ``device``, or None when it cannot be asked."""
    import torch

    try:
        _, total = torch.cuda.mem_get_info(device)
    except (RuntimeError, AssertionError, ValueError):
        return None, "unknown"
    return int(total), f"the total memory of {device}"


# --------------------------------------------------------------------------- the check


def check(cfg: Config, device=None) -> None:
    """ConfigError naming the keys of the largest allocations when the run's estimate exceeds the
    host memory or (sim on a CUDA device) the GPU memory. Allocates nothing."""
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
            f"this run needs at least {gb(total)} of {label} but the machine has "
            f"{gb(available)} ({source}): {parts}. Lower the keys named."
        )


__all__ = ["Need", "check", "device_memory", "estimate", "host_memory"]
