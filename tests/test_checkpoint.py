"""rlrec.train.checkpoint: which checkpoint resume=auto continues from, loading without running
code, the digest that detects damage, and a write that fails (a full disk)."""

import errno
import os
import pickle
import random
import re
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from rlrec import files
from rlrec.checks import ConfigError
from rlrec.train import checkpoint as ckpt


def _save(path, step):
    ckpt.save(path, {"global_step": step})


def _resumes_from(checkpoint_dir):
    """The file resume=auto continues from (None: a new run)."""
    found = ckpt.find_resume(checkpoint_dir)
    return None if found is None else found[0]


def test_resume_prefers_most_steps_and_skips_unreadable_files(tmp_path):
    assert _resumes_from(tmp_path) is None  # no checkpoint at all: a new run
    _save(tmp_path / "iter_000001.pt", 10)
    _save(tmp_path / "iter_000002.pt", 20)
    (tmp_path / "iter_000003.pt").write_bytes(b"half-written")  # a kill mid-write
    (tmp_path / "notes.pt").write_bytes(b"not ours")
    assert _resumes_from(tmp_path) == tmp_path / "iter_000002.pt"
    _save(tmp_path / "last.pt", 20)
    assert _resumes_from(tmp_path) == tmp_path / "last.pt"  # last.pt wins ties
    _save(tmp_path / "last.pt", 10)  # older than the newest periodic one (killed between writes)
    assert _resumes_from(tmp_path) == tmp_path / "iter_000002.pt"
    (tmp_path / "last.pt").write_bytes(b"")
    assert _resumes_from(tmp_path) == tmp_path / "iter_000002.pt"
    _save(tmp_path / "iter_000010.pt", 100)  # iterations sort numerically, not by name length
    assert _resumes_from(tmp_path) == tmp_path / "iter_000010.pt"


# --------------------------------------------------------------------------- no code runs on load


class _Payload:
    """Unpickled by the full unpickler, it creates ``marker``: proof that loading ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _payload_file(path, marker, kind):
    if kind == "torch":  # a torch zip archive, tagged like an rlrec checkpoint
        torch.save({"format": ckpt.FORMAT, "version": ckpt.VERSION, "x": _Payload(marker)}, path)
    else:  # a bare pickle
        path.write_bytes(pickle.dumps(_Payload(marker)))


@pytest.mark.parametrize("kind", ["torch", "pickle"])
def test_a_file_that_would_run_code_is_refused_unloaded(tmp_path, kind):
    marker = tmp_path / "pwned"
    _payload_file(tmp_path / "evil.pt", marker, kind)
    with pytest.raises(ConfigError) as e:
        try:
            ckpt.load(tmp_path / "evil.pt")
        finally:  # checked first, whatever happened
            assert not marker.exists(), "loading the checkpoint ran its payload"
    assert isinstance(e.value, ckpt.UnsafeCheckpoint)
    assert f"checkpoint={tmp_path / 'evil.pt'}" in str(e.value)
    assert "would run code" in str(e.value) and "open" in str(e.value)
    (tmp_path / "evil.pt").rename(tmp_path / "last.pt")
    with pytest.raises(ckpt.UnsafeCheckpoint, match="resume=auto: .* would run code"):
        ckpt.find_resume(tmp_path)
    assert not marker.exists()


def test_rng_states_are_plain_data_and_restore_every_stream(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    np.random.standard_normal()  # numpy's cached gaussian is part of its state
    ckpt.save(tmp_path / "last.pt", {"global_step": 1, "rng": ckpt.rng_state()})
    # what a checkpoint holds loads without the full unpickler (numpy arrays would not)
    raw = torch.load(tmp_path / "last.pt", weights_only=True)
    expected = (random.random(), np.random.standard_normal(), np.random.rand(), torch.rand(3))
    ckpt.set_rng_state(raw["rng"])
    again = (random.random(), np.random.standard_normal(), np.random.rand(), torch.rand(3))
    assert expected[:3] == again[:3] and torch.equal(expected[3], again[3])


def test_save_refuses_a_value_that_would_need_unpickling_before_writing(tmp_path):
    _save(tmp_path / "last.pt", 5)
    before = (tmp_path / "last.pt").read_bytes()
    with pytest.raises(TypeError, match=r"rng\.numpy\[1\] is a numpy\.ndarray"):
        ckpt.save(tmp_path / "last.pt", {"global_step": 6, "rng": {"numpy": np.random.get_state()}})
    assert (tmp_path / "last.pt").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_checkpoint_of_an_older_version_is_refused_with_the_version(tmp_path):
    # what version 2 wrote: numpy's RNG state as an ndarray, which needs the full unpickler
    old = {"format": ckpt.FORMAT, "version": 2, "global_step": 5, "rng": np.random.get_state()}
    torch.save(old, tmp_path / "last.pt")
    with pytest.raises(ConfigError) as e:
        ckpt.load(tmp_path / "last.pt")
    assert "has checkpoint version 2, this rlrec reads version 3" in str(e.value)


# --------------------------------------------------------------------------- damage is detected


def flip_tensor_bytes(path, n=64):
    """Flips ``n`` bytes in the middle of the largest tensor stored in the torch archive
    ``path`` (the zip stays readable: torch does not check the records' CRCs)."""
    with zipfile.ZipFile(path) as z:
        info = max(
            (i for i in z.infolist() if re.search(r"/data/\d+$", i.filename)),
            key=lambda i: i.file_size,
        )
    assert info.compress_type == zipfile.ZIP_STORED and info.file_size >= 2 * n
    raw = bytearray(Path(path).read_bytes())
    head = info.header_offset  # the local file header: 30 bytes, then the name and the extra
    name_len, extra_len = struct.unpack("<HH", raw[head + 26 : head + 30])
    start = head + 30 + name_len + extra_len + info.file_size // 2 - n // 2
    for i in range(start, start + n):
        raw[i] ^= 0xFF
    Path(path).write_bytes(bytes(raw))


def test_flipped_tensor_bytes_are_detected(tmp_path):
    ckpt.save(tmp_path / "last.pt", {"global_step": 5, "w": torch.randn(4096)})
    flip_tensor_bytes(tmp_path / "last.pt")
    torch.load(tmp_path / "last.pt", weights_only=True)  # torch itself notices nothing
    with pytest.raises(ConfigError) as e:
        ckpt.load(tmp_path / "last.pt")
    assert f"checkpoint={tmp_path / 'last.pt'} is damaged" in str(e.value)
    assert "digest" in str(e.value)


def test_resume_skips_damaged_files_and_reads_only_the_newest(tmp_path, monkeypatch):
    for i in range(1, 10):
        ckpt.save(tmp_path / f"iter_{i:06d}.pt", {"global_step": 10 * i, "w": torch.ones(512)})
    ckpt.save(tmp_path / "iter_000010.pt", {"global_step": 100, "w": torch.ones(512)})
    ckpt.save(tmp_path / "last.pt", {"global_step": 100, "w": torch.ones(512)})
    flip_tensor_bytes(tmp_path / "iter_000010.pt")
    flip_tensor_bytes(tmp_path / "last.pt")
    opened = []
    real_load = torch.load

    def spy(f, *args, **kwargs):
        opened.append(Path(f).name)
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    assert _resumes_from(tmp_path) == tmp_path / "iter_000009.pt"
    # the older periodic checkpoints are not opened
    assert sorted(opened) == ["iter_000009.pt", "iter_000010.pt", "last.pt"]


# --------------------------------------------------------------------------- a failed write


def test_a_write_that_fails_with_enospc_keeps_the_older_file_and_says_how_to_resume(
    tmp_path, monkeypatch
):
    """The temporary is a link to /dev/full, whose every write fails with ENOSPC: the real
    error path of a full disk, without filling one."""
    _save(tmp_path / "last.pt", 5)
    before = (tmp_path / "last.pt").read_bytes()
    tmp = tmp_path / f".last.pt.{os.getpid()}-0.part"
    os.symlink("/dev/full", tmp)
    monkeypatch.setattr(files, "temporary_name", lambda final, tag="": str(tmp))
    with pytest.raises(ckpt.CheckpointWriteError) as e:
        ckpt.save(tmp_path / "last.pt", {"global_step": 6}, run_dir=tmp_path.parent)
    assert e.value.__cause__.errno == errno.ENOSPC
    msg = str(e.value)
    assert f"could not write checkpoint {tmp_path / 'last.pt'}" in msg
    assert "the disk is full" in msg and "intact (last.pt" in msg
    assert f"python train.py resume=auto hydra.run.dir={tmp_path.parent}" in msg
    assert not os.path.lexists(tmp), "the temporary was left behind"
    assert (tmp_path / "last.pt").read_bytes() == before
    assert ckpt.load(tmp_path / "last.pt")["global_step"] == 5


class _FakeCuda:
    """Stands for torch.cuda's RNG functions on a machine with ``count`` visible GPUs, as
    torch.cuda's own: ``get_rng_state()`` and ``set_rng_state(state)`` take the current device's
    default generator (an IndexError past the visible ones)."""

    def __init__(self, monkeypatch, count: int, current: int):
        self.generators = [torch.Generator().manual_seed(100 + i) for i in range(count)]
        for name, fn in {
            "get_rng_state": lambda: self.generators[current].get_state(),
            "set_rng_state": lambda state: self.generators[current].set_state(state),
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "current_device": lambda: current,
        }.items():
            monkeypatch.setattr(torch.cuda, name, fn)


def test_cuda_rng_state_resumes_on_a_machine_with_fewer_gpus(monkeypatch):
    """Rank 3 of an 8-GPU node checkpoints; the run resumes (or is replayed) on a 1-GPU machine:
    the checkpoint holds this process's own device's CUDA RNG state, which goes to the one device
    there, so nothing indexes a GPU the machine does not have. Checkpoints written before held
    every visible device's state: the current device's entry is restored."""
    node = _FakeCuda(monkeypatch, count=8, current=3)
    state, expected = ckpt.rng_state(), node.generators[3].get_state()
    states = [g.get_state() for g in node.generators]
    workstation = _FakeCuda(monkeypatch, count=1, current=0)
    ckpt.set_rng_state(state)  # IndexError when every saved device is restored by index
    assert torch.equal(workstation.generators[0].get_state(), expected)
    ckpt.set_rng_state({**state, "cuda": states})  # an older checkpoint's list
    assert torch.equal(workstation.generators[0].get_state(), states[0])
