"""Linear layers with their weights prepacked for oneDNN, for the embedded engine on a CPU in float32.

A decode step multiplies a few dozen rows by every weight matrix, and at that size a plain `F.linear` spends much
of its time re-laying the weight out for the kernel on every call. oneDNN can lay a weight out once, for a batch
of about that size (`torch.ops.mkldnn._reorder_linear_weight`), and then multiply with it directly. On this CPU
that makes SmolLM2-135M's MLP and output projections ~1.3-1.7x faster at 32 rows, and the small attention
projections no faster (benchmarks/RESULTS.md, "The goal met in float32"), so only matrices of at least `MIN_WEIGHTS`
entries are packed. The result equals `F.linear` up to float rounding (~1e-6 relative).

The `nn.Linear` keeps its parameters (names, ties and state dict unchanged, so a weight push still copies into
them by name); the packed copy is rebuilt by `repack` after every push.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

MIN_WEIGHTS = 576 * 1536  # the smallest matrix packed (SmolLM2's MLP): smaller ones gain nothing
PACKED_FOR_ROWS = 32  # the batch size oneDNN lays the weights out for (a GRPO step's 4 x 8 rows)


def available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight") and hasattr(
        ops, "_linear_pointwise")


class PackedLinear(torch.nn.Module):
    """`linear` (an nn.Linear, whose parameters it shares) multiplying with a prepacked copy of its weight."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.enabled = True  # False: plain F.linear (benchmarks/micro/bench_engine_profile.py --unpacked)
        self.repack()

    def repack(self) -> None:
        """Lay out the current weight again (after new weights were copied in)."""
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), batch_size=PACKED_FOR_ROWS)

    def __deepcopy__(self, memo: dict) -> PackedLinear:  # the packed copy is oneDNN's opaque tensor: lay out anew
        import copy

        plain = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        plain.weight = copy.deepcopy(self.weight, memo)
        plain.bias = copy.deepcopy(self.bias, memo)
        twin = PackedLinear(plain)
        twin.enabled = self.enabled
        return twin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")


def pack_linears(model: torch.nn.Module) -> int:
    """Swap `model`'s float32 CPU linear layers of at least MIN_WEIGHTS entries for PackedLinear; returns how many."""
    if not available():
        return 0
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32
             and child.weight.device.type == "cpu" and child.weight.numel() >= MIN_WEIGHTS]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)


def packed_layers(model: torch.nn.Module) -> Iterator[PackedLinear]:
    return (m for m in model.modules() if isinstance(m, PackedLinear))


def repack(model: torch.nn.Module) -> None:
    """Rebuild every packed copy in `model` from its current weights."""
    for layer in packed_layers(model):
        layer.repack()
