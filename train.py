"""Train PPO with rlrec: ``python train.py [overrides]`` (see README.md)."""

from rlrec.run.cli import main

if __name__ == "__main__":
    main()
