"""Steps/s of a Genesis Forge env bare, under Genesis Forge 0.5.3's VideoWrapper and under rlrec's
drop-in, in rounds that take turns.

    python scripts/bench_genesis_forge.py [--steps 400] [--rounds 3]

The tests' ThrownBox (2 envs, 20-step episodes, 64x64, Genesis's CPU backend); every wrapper with
its default trigger and length, so the rates say what each default costs: 0.5.3 records 8 s clips
across episodes, rlrec whole episodes, and with ``record_final_episode`` and no ``expect_end`` every
other episode provisionally.
"""

from __future__ import annotations

import os
import tempfile
import time

import benchlib as bl


def main() -> None:
    b = bl.Bench(__file__, __doc__)
    b.parser.add_argument("--steps", type=int, default=400)
    b.parser.add_argument("--rounds", type=int, default=3)
    a = b.args()
    from genesis_forge.wrappers import VideoWrapper as ForgeVideoWrapper

    from rlrec.record import VideoWrapper
    from tests.record.thrown_box import make_box_class

    env = make_box_class()((20, 20))
    env.build()
    wrappers = {
        "bare env": None,
        "genesis-forge 0.5.3": ForgeVideoWrapper,
        "rlrec (record_final_episode)": VideoWrapper,
        "rlrec + expect_end(steps)": VideoWrapper,
        "rlrec record_final_episode=False": VideoWrapper,
    }
    clips = {}
    with tempfile.TemporaryDirectory(prefix="bench-genesis-forge-") as root:

        def steps_per_s(name: str):
            out, make = os.path.join(root, f"{time.monotonic_ns()}"), wrappers[name]
            env.restart()
            kw = {"record_final_episode": False} if name.endswith("=False") else {}
            w = env if make is None else make(env, out_dir=out, logging=False, **kw)
            w.build()
            if "expect_end" in name:
                w.expect_end(a.steps)
            w.reset()
            action = env.act()
            seconds = bl.per_call(lambda: w.step(action), a.steps)[0]
            w.close()
            if make is not None:
                clips[name] = len([f for f in os.listdir(out) if f.endswith(".mp4")])
            return 1 / seconds

        rates = bl.rounds({k: lambda k=k: steps_per_s(k) for k in wrappers}, a.rounds)
    b.out(f"{a.steps} steps, medians of {a.rounds} rounds (min..max)")
    rows = [
        [k, f"{bl.median(r):.0f} ({min(r):.0f}..{max(r):.0f})", clips.get(k, 0)]
        for k, r in rates.items()
    ]
    b.table(["", "steps/s", "clips"], rows)
    b.finish()


if __name__ == "__main__":
    main()
