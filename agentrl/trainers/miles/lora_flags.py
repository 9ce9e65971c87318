"""`model.lora` under `trainer=miles`: Miles' LoRA flags (miles-rl 0.0.2: `--lora-rank`, `--lora-alpha`,
`--lora-dropout`, `--target-modules`, read by its Megatron backend, which syncs the adapter to SGLang started with
`--enable-lora`), and the settings Miles cannot take, refused at plan time naming what to set instead.
"""

from __future__ import annotations

from agentrl.config.schema import RunConfig, trainer_settings
from agentrl.config.trainer import MilesTrainerConfig


def lora_problem(settings: RunConfig) -> str | None:
    """Why `model.lora` cannot map to Miles' LoRA flags (miles-rl 0.0.2, Megatron's LoRA), or None."""
    lora, t = settings.model.lora, trainer_settings(settings, MilesTrainerConfig)
    if not lora.enabled:
        return None
    if t.train_backend != "megatron":
        return (f"model.lora.enabled=true with trainer.train_backend={t.train_backend}: Miles trains LoRA adapters "
                "with its Megatron backend only (--lora-rank); set trainer.train_backend=megatron")
    if lora.push != "adapter":
        return (f"model.lora.push={lora.push}: Miles hands SGLang the adapter itself (SGLang --enable-lora); "
                "set model.lora.push=adapter")
    if float(lora.alpha) != int(lora.alpha):
        return f"model.lora.alpha={lora.alpha}: Miles' --lora-alpha takes an integer; set model.lora.alpha={round(lora.alpha)}"
    return None


def lora_args(settings: RunConfig) -> list[str]:
    """Miles' LoRA flags for `model.lora` (none when it is off); SGLang then serves the adapter Miles syncs."""
    lora = settings.model.lora
    if not lora.enabled:
        return []
    return ["--lora-rank", str(lora.rank), "--lora-alpha", str(int(lora.alpha)), "--lora-dropout", f"{float(lora.dropout):g}",
            "--target-modules", ",".join(lora.target_modules)]
