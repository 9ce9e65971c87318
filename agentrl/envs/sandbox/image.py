"""Builds the sandbox's base image locally: a Debian minbase root filesystem with python3, no registry.

    python -m agentrl.envs.sandbox.image build [--name agentrl-sandbox:latest] [--force]

The root filesystem is made once per machine with `debootstrap` and cached as a tar file; `docker import` turns it
into the image. The image holds no agentrl code (the sandbox bind-mounts the package read-only), so it only changes
when the recipe below changes. The recipe's hash is stored as an image label, which makes a second build a no-op.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_IMAGE = "agentrl-sandbox:latest"
RECIPE_LABEL = "agentrl.sandbox.recipe"

# Bump `revision` when the way the root filesystem is made changes, so cached tars and images are rebuilt.
RECIPE: dict[str, object] = {"suite": "bookworm", "variant": "minbase", "include": ["python3"], "revision": 1}
# Image settings applied by `docker import`; changing them re-imports but reuses the cached root filesystem.
CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
]


class ImageBuildError(RuntimeError):
    """The sandbox image could not be built (no Docker daemon, no debootstrap, not root, no Debian mirror)."""


def _hash(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_hash() -> str:
    """A short content hash of the root filesystem recipe; part of the cached tar's name."""
    return _hash(RECIPE)


def recipe_hash() -> str:
    """A short content hash of the whole image (root filesystem and import settings); the image's label."""
    return _hash({"rootfs": RECIPE, "changes": CHANGES})


def cache_dir() -> Path:
    """Where the root filesystem tar is cached: $AGENTRL_CACHE_DIR, else ~/.cache/agentrl."""
    env = os.environ.get("AGENTRL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "agentrl"


def rootfs_path() -> Path:
    return cache_dir() / f"rootfs-{RECIPE['suite']}-{rootfs_hash()}.tar"


def build_rootfs(out: Path, *, mirror: str | None = None) -> Path:
    """Run debootstrap into a temporary folder and pack it as `out` (a tar). Needs root and a Debian mirror."""
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed (apt-get install -y debootstrap)")
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root; run the build as root (CI does)")
    out.parent.mkdir(parents=True, exist_ok=True)
    # The work folder sits next to the cache so the final rename stays on one filesystem.
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=out.parent))
    try:
        cmd = [
            "debootstrap",
            f"--variant={RECIPE['variant']}",
            "--include=" + ",".join(RECIPE["include"]),  # type: ignore[arg-type]
            str(RECIPE["suite"]),
            str(work / "root"),
        ]
        if mirror := mirror or os.environ.get("AGENTRL_DEBIAN_MIRROR"):
            cmd.append(mirror)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageBuildError(f"debootstrap failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        root = work / "root"
        # Package archives and lists are dead weight in a sandbox that never runs apt.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        partial = out.with_suffix(".tar.partial")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True)
        partial.replace(out)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _client():
    import docker

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:  # any failure to reach the daemon reads the same to the user
        raise ImageBuildError(f"no Docker daemon answers ({exc}); start one (bash .ci/setup_docker.sh)") from exc
    return client


def image_is_current(client, name: str) -> bool:
    """True when `name` exists and was imported from the current recipe."""
    import docker

    try:
        image = client.images.get(name)
    except docker.errors.ImageNotFound:
        return False
    return (image.labels or {}).get(RECIPE_LABEL) == recipe_hash()


def build(name: str = DEFAULT_IMAGE, *, force: bool = False, mirror: str | None = None) -> str:
    """Build (or reuse) the sandbox image `name`; returns its image id."""
    import docker

    client = _client()
    if not force and image_is_current(client, name):
        return client.images.get(name).id
    try:
        previous = client.images.get(name).id
    except docker.errors.ImageNotFound:
        previous = None
    tar = rootfs_path()
    if force or not tar.exists():
        build_rootfs(tar, mirror=mirror)
    repo, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
    changes = [f"LABEL {RECIPE_LABEL}={recipe_hash()}", *CHANGES]
    client.api.import_image_from_file(str(tar), repository=repo, tag=tag, changes=changes)
    if not image_is_current(client, name):
        raise ImageBuildError(f"docker import of {tar} did not produce {name} with the recipe label")
    image_id = client.images.get(name).id
    if previous and previous != image_id:
        try:  # the superseded image is left untagged; drop it unless a container still uses it
            client.images.remove(previous)
        except docker.errors.APIError:
            pass
    return image_id


def ensure_image(name: str = DEFAULT_IMAGE) -> str:
    """Make sure the sandbox image exists and is current (building it if not); returns its image id."""
    return build(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.envs.sandbox.image", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the sandbox image (a no-op when it is current)")
    b.add_argument("--name", default=DEFAULT_IMAGE, help=f"image name (default {DEFAULT_IMAGE})")
    b.add_argument("--force", action="store_true", help="rebuild the root filesystem and re-import")
    b.add_argument("--mirror", default=None, help="Debian mirror for debootstrap (default: debootstrap's)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        image_id = build(args.name, force=args.force, mirror=args.mirror)
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.name} {image_id} ({time.perf_counter() - start:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
