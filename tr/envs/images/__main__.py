"""``python -m tr.envs.images [--rebuild]``: build the tr base image locally; print its tag."""

import argparse
import sys
import time

from tr.envs.images.base import ensure_base_image


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tr.envs.images", description=__doc__)
    parser.add_argument("--rebuild", action="store_true", help="build even if the tag exists")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        tag = ensure_base_image(rebuild=args.rebuild, log=lambda m: print(m, file=sys.stderr))
    except Exception as e:  # noqa: BLE001 - a CLI reports, it does not trace back
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(tag)
    print(f"({time.monotonic() - t0:.1f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
