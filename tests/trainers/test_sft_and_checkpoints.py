"""SFT data and training, and checkpoints that survive a full disk."""

from __future__ import annotations

import errno
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentrl.config.env import EnvConfig
from agentrl.config.model import ModelConfig
from agentrl.config.paths import PathsConfig
from agentrl.config.schema import RunConfig
from agentrl.config.trainer import SFTTrainerConfig, WarmStartConfig
from agentrl.envs.bundles import load_bundle
from agentrl.testing.tiny_models import shared_tiny_model
from agentrl.trainers.grpo import checkpoint as ckpt
from agentrl.trainers.sft.demonstrations import encode_demonstrations
from agentrl.trainers.sft.trainer import save_hf_folder, train_sft

SMALL = dict(seed=0, vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
             intermediate_size=64, max_position_embeddings=512)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = shared_tiny_model(**SMALL)  # read only: built once per session
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_demonstration_loss_mask_covers_exactly_the_tool_call(tiny) -> None:
    _, tok = tiny
    bundle = load_bundle("gridsim", prompt_style="compact")
    (ids, mask), = encode_demonstrations(tok, bundle, "train", "optimal", limit=1)
    trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    schedule = bundle.row("train", 0)["optimal_schedule"]
    assert trained.startswith("<tool_call>") and trained.endswith("</tool_call><|im_end|>")
    assert str(schedule).replace(" ", "") in trained.replace(" ", "")
    assert "D=" in tok.decode(ids) and "D=" not in trained  # the prompt is context, never a target
    assert len(ids) == max(i for i, m in enumerate(mask) if m) + 1  # the tool's answer is cut off


def test_sft_lowers_the_loss_and_saves_a_loadable_folder(tiny, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, tok = tiny
    bundle = load_bundle("gridsim", prompt_style="compact")
    data = encode_demonstrations(tok, bundle, "train", "optimal", limit=16)
    losses: list[float] = []
    train_sft(model, tok, data, steps=30, lr=3e-3, batch_samples=8, warmup_steps=3, seed=0,
              on_step=lambda s, loss: losses.append(loss))
    assert losses[-1] < 0.7 * losses[0]
    out = save_hf_folder(model, tok, tmp_path / "sft")
    again = AutoModelForCausalLM.from_pretrained(out)
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


class _FullDisk:
    def save_pretrained(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "partial.bin").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_keeps_the_last_good_checkpoint(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    good = ckpt.save(tmp_path, 1, model=model, tokenizer=tok, state={"run_id": "r1", "row_cursor": 4}, keep=2)
    with pytest.raises(ckpt.CheckpointError, match="disk is full.*step-000001"):
        ckpt.save(tmp_path, 2, model=_FullDisk(), tokenizer=tok, state={}, keep=2)
    assert ckpt.latest(tmp_path) == good
    assert ckpt.load_state(good)["row_cursor"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["step-000001"]  # no temp folder left behind
    for step in (2, 3):
        ckpt.save(tmp_path, step, model=model, tokenizer=tok, state={"run_id": "r1"}, keep=2)
    assert [s for s, _ in ckpt.checkpoints(tmp_path)] == [2, 3]


def test_augmented_demonstrations_add_other_batteries_for_the_same_days(tiny) -> None:
    _, tok = tiny
    bundle = load_bundle("gridsim", prompt_style="compact")
    plain = encode_demonstrations(tok, bundle, "train", "optimal", limit=3)
    data = encode_demonstrations(tok, bundle, "train", "optimal", limit=3, augment=2, seed=5)
    assert len(data) == 9 and data[::3] == plain  # each task: its own demonstration, then 2 variants
    assert data == encode_demonstrations(tok, bundle, "train", "optimal", limit=3, augment=2, seed=5)
    assert data != encode_demonstrations(tok, bundle, "train", "optimal", limit=3, augment=2, seed=6)


def test_generated_demonstrations_follow_the_split_s_and_are_seeded(tiny) -> None:
    _, tok = tiny
    bundle = load_bundle("gridsim", prompt_style="compact")
    plain = encode_demonstrations(tok, bundle, "train", "optimal", limit=2)
    data = encode_demonstrations(tok, bundle, "train", "optimal", limit=2, generated=3, seed=5)
    assert len(data) == 5 and data[:2] == plain and len(set(map(str, data))) == 5
    assert data == encode_demonstrations(tok, bundle, "train", "optimal", limit=2, generated=3, seed=5)
    assert data[2:] != encode_demonstrations(tok, bundle, "train", "optimal", limit=2, generated=3, seed=6)[2:]
    with pytest.raises(NotImplementedError, match="generated=0"):
        encode_demonstrations(tok, load_bundle("arith"), "train", "optimal", limit=1, generated=1)
    with pytest.raises(ValueError, match=">= 0"):
        encode_demonstrations(tok, bundle, "train", "optimal", limit=1, generated=-1)


def test_generated_demonstrations_are_encoded_when_first_drawn(tiny) -> None:
    from agentrl.trainers.sft.demonstrations import demonstration_data

    _, tok = tiny
    bundle = load_bundle("gridsim", prompt_style="compact")
    data = demonstration_data(tok, bundle, "train", "optimal", limit=2, generated=40_000, seed=5)
    assert len(data) == 40_002 and data.generated.encoded == 1  # task 0 tells how many chats a task gives
    eager = encode_demonstrations(tok, bundle, "train", "optimal", limit=0, generated=3, seed=5)
    assert [data[2], data[-1], data[3]] == [eager[0], data[40_001], eager[1]]
    assert data.generated.encoded == 3  # tasks 0, 1 and the last: nothing else was made
    with pytest.raises(IndexError):
        data[40_002]


def test_generated_demonstrations_need_as_many_chats_per_task_as_task_0() -> None:
    from agentrl.trainers.sft.demonstrations import GeneratedDemonstrations

    chat = ([{"role": "user", "content": "x"}], None)
    data = GeneratedDemonstrations(lambda i: [chat] * (2 if i < 3 else 1), lambda c, name: ([len(name)], [1]), 5)
    assert len(data) == 10 and data[5] == ([len("generated/2")], [1])  # task 2's second chat
    with pytest.raises(ValueError, match="task 3 gives 1 demonstration chats, task 0 gave 2"):
        data[6]


def _former_lr_factor(step: int, steps: int, warmup: int) -> float:
    """The hand-written schedule SFT used before transformers' (kept here as the reference)."""
    import math

    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


@pytest.mark.parametrize("steps,warmup", [(30, 3), (1500, 50), (5, 5)])
def test_lr_schedule_keeps_the_warmup_and_decays_to_a_tenth_at_the_last_step(steps: int, warmup: int) -> None:
    from agentrl.trainers.sft.trainer import lr_schedule

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=2.0)
    sched = lr_schedule(opt, steps, warmup)
    used = []
    for _ in range(steps):
        used.append(opt.param_groups[0]["lr"] / 2.0)
        opt.step()
        sched.step()
    former = [_former_lr_factor(s, steps, warmup) for s in range(steps + 1)]
    # The warmup is the former one exactly; the cosine runs one step ahead of it, so the last step trains at
    # exactly 0.1 of the rate (the former schedule reached 0.1 only after the last step).
    assert used[:warmup] == pytest.approx(former[:warmup], abs=1e-12)
    assert used[warmup:] == pytest.approx(former[warmup + 1:], abs=1e-12)
    assert used[-1] == pytest.approx(0.1 if steps > warmup else 1.0, abs=1e-12)


def run_settings(bundle: str, model: str, checkpoint_dir: str, **model_keys: object) -> RunConfig:
    """The typed settings the SFT cache key reads (`Plan.settings`' env, model, seed, paths)."""
    return RunConfig(env=EnvConfig(bundle=bundle), model=ModelConfig(path=model, **model_keys),
                     paths=PathsConfig(checkpoint_dir=checkpoint_dir), seed=0)


def test_sft_cache_folder_names_stay_those_of_cached_warm_starts() -> None:
    from agentrl.trainers.sft.trainer import sft_checkpoint_path

    settings = WarmStartConfig(teacher="optimal", steps=1500, lr=3e-3, batch_samples=32, warmup_steps=50, augment=7,
                               weight_decay=0.0)
    # Names computed by the key that read env.prompt_style (before bundles declared their data options).
    expected = {("gridsim", "compact"): "gridsim-optimal-s1500-f3b87806ea",
                ("gridsim", "full"): "gridsim-optimal-s1500-73e74dcaca", ("arith", None): "arith-optimal-s1500-3f3bbe2b3d"}
    for (name, style), folder in expected.items():
        bundle = load_bundle(name, **({"prompt_style": style} if style else {}))
        assert sft_checkpoint_path(run_settings(name, "/m/tiny", "/ck"), settings, bundle) == Path("/ck/sft") / folder
    # trainer=sft's own settings key alike: the warm start and an SFT run of the same settings share a folder.
    same = SFTTrainerConfig(teacher="optimal", steps=1500, lr=3e-3, batch_samples=32, warmup_steps=50, augment=7)
    assert sft_checkpoint_path(run_settings("arith", "/m/tiny", "/ck"), same, load_bundle("arith")).name == \
        expected[("arith", None)]
    # A bfloat16 model's folder is its own; float32 keeps the names above.
    bf16 = sft_checkpoint_path(run_settings("arith", "/m/tiny", "/ck", dtype="bfloat16"), settings, load_bundle("arith"))
    assert bf16.name.startswith("arith-optimal-s1500-") and bf16.name != expected[("arith", None)]


def test_generated_demonstrations_change_the_sft_cache_key_only_when_set() -> None:
    from agentrl.trainers.sft.trainer import sft_checkpoint_path

    settings = WarmStartConfig(teacher="optimal", steps=1500, lr=3e-3, batch_samples=32, warmup_steps=50, augment=7,
                               weight_decay=0.0)
    run = run_settings("gridsim", "/m/tiny", "/ck")
    bundle = load_bundle("gridsim", prompt_style="compact")
    before = sft_checkpoint_path(run, settings, bundle)
    assert sft_checkpoint_path(run, replace(settings, generated=0), bundle) == before
    more = {sft_checkpoint_path(run, replace(settings, generated=n), bundle) for n in (1000, 2000)}
    assert len(more) == 2 and before not in more


def test_a_new_demonstrations_version_makes_a_new_warm_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.trainers.sft import trainer as sft

    settings = WarmStartConfig(teacher="optimal", steps=1500, lr=3e-3, batch_samples=32, warmup_steps=50, augment=7,
                               weight_decay=0.0)
    run, bundle = run_settings("arith", "/m/tiny", "/ck"), load_bundle("arith")
    before = sft.sft_checkpoint_path(run, settings, bundle)
    monkeypatch.setattr(sft, "DEMONSTRATIONS_VERSION", sft.DEMONSTRATIONS_VERSION + 1)
    after = sft.sft_checkpoint_path(run, settings, bundle)
    assert after.parent == before.parent and after.name.startswith("arith-optimal-s1500-") and after != before


def test_a_data_option_changes_the_sft_cache_key(tmp_path: Path) -> None:
    from agentrl.trainers.sft.trainer import sft_checkpoint_path

    settings = WarmStartConfig(teacher="optimal", steps=10, lr=1e-3, batch_samples=2, warmup_steps=1, augment=0,
                               weight_decay=0.0)
    run = run_settings("arith", "/m", str(tmp_path))
    paths = set()
    for i in range(2):
        data = tmp_path / f"mine{i}.jsonl"
        data.write_text('{"prompt": "1+1?", "label": "2"}\n')
        paths.add(sft_checkpoint_path(run, settings, load_bundle("arith", data_file=str(data))))
    paths.add(sft_checkpoint_path(run, settings, load_bundle("arith")))
    assert len(paths) == 3  # two users' files and the shipped rows: three warm starts
