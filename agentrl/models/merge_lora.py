"""`python -m agentrl.models.merge_lora ADAPTER OUT`: a LoRA adapter folder (a LoRA run's `final_model` or a
checkpoint's `model/`) merged into its base, saved as a full Hugging Face folder (weights, config, tokenizer)
that any engine or `model=hf` loads. Nothing is fetched: the base is the local folder the adapter names.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from agentrl.models.lora_folder import adapter_base


def merge_lora(adapter: str | Path, out: str | Path) -> Path:
    """Merge the adapter at `adapter` into its base (W + alpha/r * B @ A, in the base's dtype) and save the full
    model and the adapter's tokenizer to `out`; returns `out`. ValueError when `adapter` is no adapter folder."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = adapter_base(adapter)
    if base is None:
        raise ValueError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    out = Path(out)
    model = AutoModelForCausalLM.from_pretrained(base, dtype="auto", local_files_only=True)
    with torch.no_grad():
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(adapter, local_files_only=True).save_pretrained(out)
    for extra in ("generation_config.json",):  # the base's sampling defaults (stop tokens) travel with it
        if (Path(base) / extra).is_file():
            shutil.copy(Path(base) / extra, out / extra)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentrl.models.merge_lora", description=__doc__)
    parser.add_argument("adapter", help="a LoRA adapter folder (adapter_config.json names its base)")
    parser.add_argument("out", help="the folder to write the merged model to")
    args = parser.parse_args(argv)
    try:
        print(f"merged model saved to {merge_lora(args.adapter, args.out)}")
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"merge_lora: {exc}") from None


if __name__ == "__main__":
    main()
