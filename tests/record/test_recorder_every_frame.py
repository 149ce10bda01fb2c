"""Every frame sent reaches the file, for every clip length 1..64 and a spread up to 600, at 30
and 50 fps. (moviepy-based recorders drop the last frame of about half of these at 50 fps.)"""

import numpy as np
import pytest

from rlrec.envs.builtin import PointReach
from rlrec.record import Recorder
from tests.record.recutil import decode, decode_many, rec_cfg, zeros

LENGTHS = list(range(1, 65)) + [65, 100, 127, 128, 129, 256, 333, 599, 600]


@pytest.mark.parametrize("fps", [30, 50])
def test_every_frame_reaches_the_file(tmp_path, fps):
    """One recorder, whole-episode clips; episode k is truncated after LENGTHS[k] - 1 steps, so its
    clip has LENGTHS[k] frames and ends on the terminal frame (the progress bar's last column is
    lit only there, so that frame differs from every other one). A one-frame clip is a clip cut
    by the next full reset right after its reset frame."""
    env = PointReach(1, render_width=16, render_height=16, dt=1.0 / fps, seed=0)
    clips, last_sent = [], {}
    rec = Recorder(env, rec_cfg(trigger="always"), str(tmp_path), on_clip=clips.append)
    for episode, length in enumerate(LENGTHS):
        env.max_episode_steps = max(1, length - 1)
        rec.reset(seed=episode)  # a full reset: ends nothing (the last clip ended), starts a clip
        for _ in range(length - 1):
            _, _, _, truncated, _ = rec.step(zeros(env))
        assert length == 1 or bool(truncated[0])
        last_sent[episode] = env.render([0])[0].numpy().copy()
    rec.close()  # the one-frame clip of the first episode was ended by the second reset
    assert [c.num_frames for c in clips] == LENGTHS
    out = tmp_path / "decoded"
    out.mkdir()
    decoded = decode_many([c.path for c in clips], (16, 16), out)
    for clip, frames in zip(clips, decoded):
        assert len(frames) == clip.num_frames, clip.path
        assert np.array_equal(frames[-1], last_sent[clip.episode]), clip.path
    for clip in (clips[0], clips[-1]):
        assert decode(clip.path)[1] == fps  # the real fps is in the file
