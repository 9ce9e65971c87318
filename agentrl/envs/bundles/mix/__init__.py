"""`env=mix`: several bundles served as one, each train row drawn from one of them by weight (see `bundle.py`;
`groups.py` reads and checks `env.bundles` where the plan is built)."""

from __future__ import annotations

from agentrl.envs.bundles.mix.bundle import MixBundle, make_bundle, shares

__all__ = ["MixBundle", "make_bundle", "shares"]
