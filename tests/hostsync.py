"""Counting host syncs on the CPU: a TorchFunctionMode that treats the CPU as a stand-in device.

On a GPU, every op that hands a value back to the host (``bool(t)``, ``.item()``, ``.tolist()``,
``.cpu()``, ``.numpy()``) or that must know a data-dependent size (``nonzero``, boolean-mask
indexing, ``masked_select``, ``unique``) waits for the device. ``torch.cuda.set_sync_debug_mode``
reports those, but only where CUDA is. :class:`HostReads` counts the same ops on CPU tensors:

- a tensor is *on the device* unless it is known to be on the host: the result of a read back
  (``.cpu()``, ``.numpy()``...), a tensor made without a ``device`` argument from host data
  (``torch.tensor([1, 2])``), or a result computed only from host tensors;
- an op counts as one sync when it is a read back or a data-dependent-size op and one of its
  tensor inputs is on the device; a ``copy_`` from the device into a host tensor counts too.

Blind spot: ``.to(device)`` to the stand-in device (the CPU) cannot be told from a copy back to
the host, so a read back must be written ``.cpu()`` (or ``.numpy()``/``.tolist()``) to be seen.
The mode is per thread: an encoder thread's own ops are not counted.
"""

from __future__ import annotations

import traceback
from typing import Any, List, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_HOST = "_hostsync_on_host"

T = torch.Tensor
# ops that hand a value (or the tensor) back to the host
READS = {
    T.__bool__,
    T.__int__,
    T.__float__,
    T.__index__,
    T.__complex__,
    T.item,
    T.tolist,
    T.numpy,
    T.cpu,
    T.equal,
    torch.equal,
    torch.allclose,
    T.allclose,
    torch.is_nonzero,
    T.is_nonzero,
}
if hasattr(T, "__array__"):
    READS.add(T.__array__)
# ops whose output size depends on the data: the device is asked for it
DATA_SIZED = {
    torch.nonzero,
    T.nonzero,
    torch.argwhere,
    T.argwhere,
    torch.masked_select,
    T.masked_select,
    torch.unique,
    T.unique,
    torch.unique_consecutive,
    T.unique_consecutive,
}
INDEXING = {T.__getitem__, T.__setitem__, T.index_put_, T.index_put, torch.index_put}


def _tensors(args, kwargs) -> List[torch.Tensor]:
    flat, _ = tree_flatten((args, kwargs or {}))
    return [x for x in flat if isinstance(x, torch.Tensor)]


def on_host(t: torch.Tensor) -> bool:
    return bool(getattr(t, _HOST, False))


def _mark(out: Any) -> None:
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            try:
                setattr(t, _HOST, True)
            except (AttributeError, RuntimeError):  # pragma: no cover - e.g. a frozen subclass
                pass


def _bool_index(func, args) -> bool:
    if func not in INDEXING or len(args) < 2:
        return False
    flat, _ = tree_flatten(args[1])
    return any(isinstance(x, torch.Tensor) and x.dtype == torch.bool for x in flat)


def _names_device(func, args, kwargs) -> bool:
    """Whether the op puts its result on a device it is given (``.to(device)``, ``device=``)."""
    if "device" in kwargs or func is T.cuda:
        return True
    if func is T.to:
        return any(isinstance(a, (torch.device, str, int)) for a in args[1:])
    return False


class HostReads(TorchFunctionMode):
    """``with HostReads() as reads:`` counts host syncs (``reads.count``; ``reads.where``: the op
    and the line of rlrec that asked, for each)."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.where: List[Tuple[str, str]] = []

    def reset(self) -> int:
        """The count so far, then zero."""
        n, self.count = self.count, 0
        self.where.clear()
        return n

    def _record(self, func) -> None:
        self.count += 1
        caller = "?"
        for frame in reversed(traceback.extract_stack(limit=12)[:-2]):
            if "/rlrec/" in frame.filename and "hostsync" not in frame.filename:
                caller = f"{frame.filename.rsplit('/rlrec/', 1)[-1]}:{frame.lineno} {frame.line}"
                break
        self.where.append((getattr(func, "__name__", str(func)), caller))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors(args, kwargs)
        device_inputs = [t for t in inputs if not on_host(t)]
        single_where = func is torch.where and len(args) + len(kwargs) == 1
        if device_inputs and (
            func in READS or func in DATA_SIZED or single_where or _bool_index(func, args)
        ):
            self._record(func)
        elif func is T.copy_ and on_host(args[0]) and not on_host(args[1]):
            self._record(func)  # device -> host copy into a host buffer
        out = func(*args, **kwargs)
        if func in READS:
            if any(out is t for t in inputs):  # .cpu() of a CPU tensor: on a GPU, a new tensor
                out = out.clone()
            _mark(out)
        elif func is T.copy_:
            pass  # in place: the destination keeps its side
        elif inputs:
            if not device_inputs and not _names_device(func, args, kwargs):
                _mark(out)
        elif "device" not in kwargs:
            _mark(out)  # made from host data (a list, an array), no device named
        return out
