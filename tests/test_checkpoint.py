"""checkpoint.newest: which checkpoint resume=auto continues from."""

from rlrec import checkpoint as ckpt


def _save(path, step):
    ckpt.save(path, {"global_step": step})


def test_newest_prefers_most_steps_and_skips_unreadable_files(tmp_path):
    assert ckpt.newest(tmp_path) is None
    _save(tmp_path / "iter_000001.pt", 10)
    _save(tmp_path / "iter_000002.pt", 20)
    (tmp_path / "iter_000003.pt").write_bytes(b"half-written")  # a kill mid-write
    (tmp_path / "notes.pt").write_bytes(b"not ours")
    assert ckpt.newest(tmp_path) == tmp_path / "iter_000002.pt"
    _save(tmp_path / "last.pt", 20)
    assert ckpt.newest(tmp_path) == tmp_path / "last.pt"  # last.pt wins ties
    _save(tmp_path / "last.pt", 10)  # older than the newest periodic one (killed between writes)
    assert ckpt.newest(tmp_path) == tmp_path / "iter_000002.pt"
    (tmp_path / "last.pt").write_bytes(b"")
    assert ckpt.newest(tmp_path) == tmp_path / "iter_000002.pt"
    _save(tmp_path / "iter_000010.pt", 100)  # iterations sort numerically, not by name length
    assert ckpt.newest(tmp_path) == tmp_path / "iter_000010.pt"


def test_save_leaves_no_temporary_file(tmp_path):
    _save(tmp_path / "last.pt", 5)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert ckpt.load(tmp_path / "last.pt")["global_step"] == 5
