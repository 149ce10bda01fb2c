"""Steps per second of a Genesis Forge env under Genesis Forge 0.5.3's VideoWrapper and under
rlrec's drop-in, in interleaved rounds (medians printed).

    PYTHONPATH=. python scripts/bench_genesis_forge.py [--steps 400] [--rounds 3]

The env is the tests' ThrownBox (tests/record/thrown_box.py): 2 envs, episodes of 20 steps, a
64x64 camera, Genesis CPU backend. Every wrapper uses its default trigger (the capped cubic
schedule) and default length (8 s). What is recorded differs, so the rates say what each default
costs: 0.5.3 records 8 s clips spanning episodes; rlrec records whole episodes 0, 1 and 8 and, with
``record_final_episode`` and no ``expect_end``, every other episode provisionally.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from tests.record.thrown_box import make_box_class

    env = make_box_class()((20, 20))
    env.build()
    from genesis_forge.wrappers import VideoWrapper as ForgeVideoWrapper

    from rlrec.record import VideoWrapper

    configs = {
        "bare env": None,
        "genesis-forge 0.5.3": lambda out: ForgeVideoWrapper(env, out_dir=out, logging=False),
        "rlrec (record_final_episode)": lambda out: VideoWrapper(env, out_dir=out, logging=False),
        "rlrec + expect_end(steps)": lambda out: VideoWrapper(env, out_dir=out, logging=False),
        "rlrec record_final_episode=False": lambda out: VideoWrapper(
            env, out_dir=out, logging=False, record_final_episode=False
        ),
    }
    rates: dict = {name: [] for name in configs}
    clips: dict = {}
    root = tempfile.mkdtemp(prefix="bench-genesis-forge-")
    try:
        for _ in range(args.rounds):
            for name, make in configs.items():
                out = os.path.join(root, str(len(rates[name])) + name.replace(" ", "_"))
                env.restart()
                w = env if make is None else make(out)
                w.build()
                if name.startswith("rlrec + expect_end"):
                    w.expect_end(args.steps)
                w.reset()
                action = env.act()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    w.step(action)
                rates[name].append(args.steps / (time.perf_counter() - t0))
                w.close()
                if make is not None:
                    clips[name] = len([f for f in os.listdir(out) if f.endswith(".mp4")])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, r in rates.items():
        print(
            f"{name:34s} {statistics.median(r):7.0f} steps/s (median of {len(r)}: "
            f"{min(r):.0f}..{max(r):.0f})  clips: {clips.get(name, 0)}"
        )


if __name__ == "__main__":
    main()
