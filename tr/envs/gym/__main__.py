"""`python -m tr.envs.gym`: write gym instances as task directories, or list the families.

    write DIR --split test --count 64 [--family F ...] [--seed S]
    families
"""

from __future__ import annotations

import argparse
import sys

from tr.envs import gym


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tr.envs.gym", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write a split's instances as tr-layout task directories")
    write.add_argument("dir")
    write.add_argument("--split", default="test", choices=gym.SPLITS)
    write.add_argument("--count", type=int, default=64)
    write.add_argument("--family", action="append", default=None, choices=sorted(gym.FAMILIES),
                       help="only this family (repeatable)")
    write.add_argument("--seed", type=int, default=0, help="split seed: instance seeds start at "
                       f"SEED * {gym.SEED_STRIDE}")
    sub.add_parser("families", help="name, tier, observes, undo of every family")
    args = parser.parse_args(argv)
    if args.command == "families":
        for f in gym.FAMILIES.values():
            flags = ",".join(x for x, on in (("observes", f.observes), ("undo", f.undo)) if on)
            held = " (held out of train)" if f.name == gym.HELDOUT_FAMILY else ""
            print(f"{f.name:16} {f.tier:8} {flags or '-':14} {f.summary}{held}")
        return 0
    try:
        pairs = gym.split_seeds(args.split, args.count, seed=args.seed, families=args.family)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for family, seed in pairs:
        gym.write_task(family, seed, args.dir)
    print(f"wrote {len(pairs)} {args.split} task(s) to {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
