"""A device with its index, and making it torch's current one: what the device that
``rlrec.envs.factory.resolve_device`` resolved once for this process (or rank) goes through
wherever it is used."""

from __future__ import annotations

import torch


def explicit(device: torch.device) -> torch.device:
    """``device`` with its index: a bare ``cuda`` becomes torch's current CUDA device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def use_device(device: torch.device) -> None:
    """Makes ``device`` torch's current CUDA device (a no-op for any other device), so that what
    follows the current device uses this rank's GPU and not cuda:0: Genesis's ``gs.init``
    (``genesis/utils/misc.py`` ``get_device``: ``device_idx = torch.cuda.current_device()``),
    CUDA tensors made without a device, CUDA graphs' memory pools."""
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(device)
