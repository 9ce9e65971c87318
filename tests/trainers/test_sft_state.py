"""A Ctrl-C'd SFT keeps its progress: the same call continues it and ends where an unstopped run ends."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
import torch

from agentrl import interrupts
from agentrl.envs.bundles import load_bundle
from agentrl.testing.tiny_models import shared_tiny_model
from agentrl.trainers.sft.demonstrations import encode_demonstrations
from agentrl.trainers.sft.state import STATE_FILE, clear_state, state_dir
from agentrl.trainers.sft.trainer import train_sft

SMALL = dict(seed=0, vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
             intermediate_size=64, max_position_embeddings=512)
STEPS = 8
SETTINGS = dict(steps=STEPS, lr=3e-3, batch_samples=4, warmup_steps=2, seed=0)


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoTokenizer

    path = shared_tiny_model(**SMALL)
    tok = AutoTokenizer.from_pretrained(path)
    data = encode_demonstrations(tok, load_bundle("gridsim", prompt_style="compact"), "train", "optimal", limit=12)
    return path, tok, data


def _fresh(path: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path)


def _ctrl_c_after(stop_at: int, losses: dict[int, float]):
    """An on_step that records the loss and, after step `stop_at`, delivers Ctrl-C as the handler would inside
    the loop (deferred to the next stop point)."""
    def on_step(step: int, loss: float) -> None:
        losses[step] = loss
        if step == stop_at:
            interrupts._pending = signal.SIGINT
    return on_step


def _stopped_run(path: str, tok, data, state: Path, stop_at: int, **settings) -> dict[int, float]:
    losses: dict[int, float] = {}
    try:
        with pytest.raises(KeyboardInterrupt):
            train_sft(_fresh(path), tok, data, **{**SETTINGS, **settings}, state=state,
                      on_step=_ctrl_c_after(stop_at, losses))
    finally:
        interrupts._pending = None
    return losses


def test_a_stopped_sft_continues_from_its_step_and_ends_where_an_unstopped_run_does(setup, tmp_path: Path,
                                                                                   capsys) -> None:
    path, tok, data = setup
    reference, ref_losses = _fresh(path), {}
    train_sft(reference, tok, data, **SETTINGS, on_step=lambda s, loss: ref_losses.__setitem__(s, loss))

    state = state_dir(tmp_path / "sft")
    first = _stopped_run(path, tok, data, state, stop_at=3)
    assert sorted(first) == [1, 2, 3] and (state / STATE_FILE).is_file()
    assert "SFT stopped after step 3/8" in capsys.readouterr().out

    model, rest = _fresh(path), {}
    train_sft(model, tok, data, **SETTINGS, state=state, on_step=lambda s, loss: rest.__setitem__(s, loss))
    assert "continuing a stopped run from step 3/8" in capsys.readouterr().out
    assert sorted(rest) == [4, 5, 6, 7, 8]  # no step trained twice, none skipped
    # the same batches, optimizer moments and LR schedule as the run nobody stopped
    assert rest == pytest.approx({s: ref_losses[s] for s in rest}, rel=1e-4)
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    # a fresh model merely retrained from step 4 would not match: the state carried real progress
    assert not torch.allclose(_fresh(path).lm_head.weight, model.lm_head.weight)


def test_a_state_made_with_other_settings_is_set_aside_not_continued(setup, tmp_path: Path, capsys) -> None:
    path, tok, data = setup
    state = state_dir(tmp_path / "sft")
    _stopped_run(path, tok, data, state, stop_at=2)
    capsys.readouterr()
    seen: list[int] = []
    train_sft(_fresh(path), tok, data, **{**SETTINGS, "lr": 1e-3}, state=state, on_step=lambda s, _: seen.append(s))
    assert seen[0] == 1 and len(seen) == STEPS  # started over
    assert "not continuing the stopped run's state" in capsys.readouterr().out
    assert (state.with_name(f"{state.name}.stale") / STATE_FILE).is_file()
    clear_state(state)
    assert not state.exists() and not state.with_name(f"{state.name}.stale").exists()


def test_an_unreadable_state_starts_over(setup, tmp_path: Path, capsys) -> None:
    path, tok, data = setup
    state = state_dir(tmp_path / "sft")
    state.mkdir(parents=True)
    (state / STATE_FILE).write_bytes(b"torn by a full disk")
    seen: list[int] = []
    train_sft(_fresh(path), tok, data, **SETTINGS, state=state, on_step=lambda s, _: seen.append(s))
    assert seen == list(range(1, STEPS + 1))
    assert "not continuing" in capsys.readouterr().out


def test_a_stop_before_the_first_step_keeps_nothing(setup, tmp_path: Path) -> None:
    path, tok, data = setup
    state = state_dir(tmp_path / "sft")
    interrupts._pending = signal.SIGINT
    try:
        with pytest.raises(KeyboardInterrupt):
            train_sft(_fresh(path), tok, data, **SETTINGS, state=state)
    finally:
        interrupts._pending = None
    assert not (state / STATE_FILE).exists()


@pytest.mark.parametrize(("trainer", "extra", "why"), [
    ("grpo", [], "it stopped before its first checkpoint; its SFT continues from step 7"),
    ("sft", [], "its SFT continues from step 7"),
    ("grpo", ["trainer.warm_start.enabled=false"], "it stopped before its first checkpoint"),
])
def test_the_closing_block_says_from_which_step_the_rerun_s_sft_continues(trainer: str, extra: list[str], why: str,
                                                                         tmp_path: Path) -> None:
    from agentrl.plan import build_plan
    from agentrl.run import stopped_line
    from agentrl.testing.config import compose_config
    from agentrl.trainers.sft.state import save_state
    from agentrl.trainers.sft.trainer import sft_checkpoint_path

    cfg = compose_config(f"trainer={trainer}", *extra, f"paths.output_root={tmp_path}")
    plan = build_plan(cfg, choices={"trainer": trainer}, run_dir=tmp_path / "run")
    t = plan.settings.trainer
    settings = t if trainer == "sft" else t.warm_start
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    save_state(state_dir(sft_checkpoint_path(plan.settings, settings, plan.bundle, plan.agent)), step=7, key="k",
               model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
               rng=random.Random(0))
    line = stopped_line(plan, "run0", ["trainer.steps=5"])
    assert line == f"rerun it      python -m agentrl trainer.steps=5  ({why})"
