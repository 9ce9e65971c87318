"""`python -m agentrl.envs.bundles.calc build`: regenerate the shipped problem files and manifest."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.envs.bundles.calc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="regenerate the stored problems and manifest bit for bit")
    b.add_argument("--out", type=Path, default=None, help="folder to write (default: the shipped bundle)")
    args = parser.parse_args(argv)
    from .build import DEFAULT_FOLDER, build

    manifest = build(args.out or DEFAULT_FOLDER)
    for name, digest in manifest["files"].items():
        print(f"{name}  sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
