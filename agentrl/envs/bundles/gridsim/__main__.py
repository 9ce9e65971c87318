"""`python -m agentrl.envs.bundles.gridsim {build,baselines}`: regenerate the packs, or print the baseline table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.envs.bundles.gridsim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="regenerate the stored task packs and manifest bit for bit")
    b.add_argument("--out", type=Path, default=None, help="folder to write (default: the shipped bundle)")
    b.add_argument("--json", action="store_true", help="print the manifest as JSON")
    s = sub.add_parser("baselines", help="score the reference policies on a stored split")
    s.add_argument("--split", default="eval", choices=("train", "eval"))
    s.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)

    if args.command == "build":
        from .build import DEFAULT_FOLDER, build

        manifest = build(args.out or DEFAULT_FOLDER)
        if args.json:
            print(json.dumps(manifest, indent=2, sort_keys=True))
        else:
            for name, digest in manifest["files"].items():
                print(f"{name}  sha256 {digest}")
        return 0

    from agentrl.envs.bundles import load_bundle

    from .baselines import baseline_table, format_table

    bundle = load_bundle("gridsim")
    table = baseline_table(bundle.rows(args.split))
    if args.json:
        print(json.dumps(table, indent=2))
    else:
        print(format_table(table, f"GridSim v1 {args.split} ({bundle.splits()[args.split]} days): mean score"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
