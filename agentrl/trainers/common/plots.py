"""The reward-curve figure saved at the end of a run."""

from __future__ import annotations

from pathlib import Path


def reward_curves(history: dict[str, list[tuple[int, float]]], path: Path, title: str = "") -> Path:
    """Plot each named series of (step, value) on one axis (matplotlib Agg) and save a PNG to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for name, points in history.items():
        if points:
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title or "reward")
    ax.grid(alpha=0.3)
    ax.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
