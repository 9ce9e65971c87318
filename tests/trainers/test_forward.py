"""The training forward pass: logits only where the loss needs them, the batch's shared prompt run once."""

from __future__ import annotations

import pytest
import torch

from agentrl.models.tiny import ensure_tiny_model
from agentrl.trainers.common.forward import first_loss_column, next_token_logits, shared_prefix_length

SMALL = dict(seed=0, vocab_size=1024, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
             intermediate_size=64, max_position_embeddings=512)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model(str(tmp_path_factory.mktemp("m") / "tiny"), **SMALL)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def right_padded(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = torch.tensor(row)
        attn[r, :len(row)] = 1
    return ids, attn


def batch_with_shared_prompt() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 1000, (40,), generator=g).tolist()
    tails = [torch.randint(5, 1000, (n,), generator=g).tolist() for n in (12, 7, 20)]
    return right_padded([prompt + t for t in tails])


def test_shared_prefix_length_stops_at_the_first_difference_or_padding() -> None:
    ids, attn = right_padded([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 3]])
    assert shared_prefix_length(ids, attn) == 3
    ids, attn = right_padded([[1, 2, 3, 4], [1, 2]])
    assert shared_prefix_length(ids, attn) == 2  # row 2's padding is not a shared token
    ids, attn = right_padded([[7, 2], [1, 2]])
    assert shared_prefix_length(ids, attn) == 0
    assert shared_prefix_length(*right_padded([[1, 2, 3]])) == 0  # one row: nothing to share


def test_first_loss_column() -> None:
    mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 0]])
    assert first_loss_column(mask) == 2
    assert first_loss_column(torch.zeros((2, 4))) == 0


@pytest.mark.parametrize("share_prefix", [True, False])
def test_logits_and_gradients_match_the_plain_forward_pass(model, share_prefix: bool) -> None:
    ids, attn = batch_with_shared_prompt()
    start = 45  # inside every row's own tail, past the 40 shared tokens
    targets = ids[:, start + 1:]
    weight = attn[:, start + 1:].float()

    def loss_of(logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return -(logp * weight).sum()

    model.zero_grad()
    plain = model(input_ids=ids, attention_mask=attn).logits[:, start:-1]
    loss_of(plain).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    fast = next_token_logits(model, ids, attn, start, share_prefix=share_prefix)
    assert fast.shape == plain.shape
    real = attn[:, start:-1].bool()  # padded positions' logits are never used
    torch.testing.assert_close(fast[real], plain.detach()[real], atol=2e-5, rtol=1e-4)
    loss_of(fast).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], atol=2e-5, rtol=1e-4, msg=n)


def test_a_lora_model_shares_the_prefix_through_the_current_cache_argument(tmp_path) -> None:
    """PEFT's wrapper hides the base model's forward signature: the cache must still go under the name the base
    takes (`cache` in transformers 5.2x; `past_key_values` warns, and goes in 5.40), with the plain pass's logits."""
    import inspect
    import warnings

    from transformers import AutoModelForCausalLM

    from agentrl.config.model import LoraConfig
    from agentrl.trainers.common.lora import wrap

    path = ensure_tiny_model(str(tmp_path / "tiny"), **SMALL)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    takes_cache = "cache" in inspect.signature(base.forward).parameters
    peft_model = wrap(base, LoraConfig(enabled=True, rank=4, alpha=8.0))
    ids, attn = batch_with_shared_prompt()
    start = 45
    plain = peft_model(input_ids=ids, attention_mask=attn).logits[:, start:-1].detach()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = next_token_logits(peft_model, ids, attn, start, share_prefix=True)
    real = attn[:, start:-1].bool()
    torch.testing.assert_close(fast.detach()[real], plain[real], atol=2e-5, rtol=1e-4)
    if takes_cache:
        assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]
