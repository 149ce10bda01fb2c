"""FrameSpy: the layer the recording tests of every backend put right below the recorder.

``AutoReset(Recorder(FrameSpy(adapter)))``: it keeps, for env ``watch``, every frame of every
episode as the env showed it (the reset frame, then one per step), and the render requests the
recorder made, so a test can compare each clip with the frames it must hold, frame for frame.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from rlrec.envs.base import EnvWrapper, as_env_index


class FrameSpy(EnvWrapper):
    def __init__(self, env, watch: int = 0, keep_frames: bool = True, close_inner: bool = True):
        super().__init__(env)
        self.watch = watch
        self.keep_frames = keep_frames
        self.close_inner = close_inner
        # one list per episode of env `watch`; frames are None when keep_frames is False
        self.episodes: List[List[Optional[np.ndarray]]] = []
        self.render_requests: List[List[int]] = []  # env indices of each render() from above

    @property
    def render_calls(self) -> int:
        return len(self.render_requests)

    def _frame(self) -> Optional[np.ndarray]:
        return self.env.render([self.watch])[0].cpu().numpy().copy() if self.keep_frames else None

    def reset(self, seed=None, env_idx=None):
        out = self.env.reset(seed=seed, env_idx=env_idx)
        if self.watch in as_env_index(env_idx, self.num_envs, self.device).tolist():
            self.episodes.append([self._frame()])
        return out

    def step(self, action):
        out = self.env.step(action)
        if self.episodes:
            self.episodes[-1].append(self._frame())
        return out

    def render(self, env_idx):
        self.render_requests.append(as_env_index(env_idx, self.num_envs, self.device).tolist())
        return self.env.render(env_idx)

    def close(self):
        if self.close_inner:
            self.env.close()


def decode(path: str) -> Tuple[np.ndarray, float]:
    """All frames of an mp4 as uint8 ``[n, H, W, 3]`` and the fps written in the file."""
    import imageio_ffmpeg

    gen = imageio_ffmpeg.read_frames(path, pix_fmt="rgb24")
    meta = next(gen)
    w, h = meta["size"]
    frames = [np.frombuffer(b, np.uint8).reshape(h, w, 3) for b in gen]
    return np.stack(frames) if frames else np.zeros((0, h, w, 3), np.uint8), float(meta["fps"])
