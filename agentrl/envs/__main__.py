"""`python -m agentrl.envs new NAME [--dir DIR]`: a bundle folder from the template (see envs/template);
`python -m agentrl.envs refresh FOLDER`: rewrite its manifest after editing its data files."""

from __future__ import annotations

import argparse
import sys

from agentrl.envs.template import new_bundle, refresh


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.envs", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", help="write a bundle folder of your own from the template")
    new.add_argument("name")
    new.add_argument("--dir", default=".", help="the folder to create it in (default: here)")
    new.add_argument("--force", action="store_true", help="overwrite an existing folder")
    ref = sub.add_parser("refresh", help="rewrite bundle.json's counts and fingerprints from the data files")
    ref.add_argument("folder")
    args = parser.parse_args(argv)
    try:
        if args.command == "new":
            folder = new_bundle(args.name, args.dir, force=args.force)
            print(f"wrote {folder}: edit bundle.py, test with `pytest {folder}/test_bundle.py`, train with "
                  f"`python -m agentrl env=custom env.bundle={folder.resolve()}`")
        else:
            refresh(args.folder)
            print(f"refreshed {args.folder}/bundle.json")
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
