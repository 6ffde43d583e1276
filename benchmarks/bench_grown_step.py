"""A grown model's training step against the natively built deeper model's, side by side.

    python benchmarks/bench_grown_step.py
    python benchmarks/bench_grown_step.py --widths 32 128 --steps 30 --rounds 7
    python benchmarks/bench_grown_step.py --device cuda --precision bf16 --widths 128 512 1024

For a user's own nanoGPT-style model and for Hugging Face GPT-2 (built from a config), at each
width: ``native`` is the model born with 4 blocks; ``grown`` is the 1-block model whose growth
slot (``DepthGrowth(blocks=3)``) holds three ``identity`` blocks, fossilized, still running
through the slot's hook and its `GrownBlocks`; ``handed back`` is the grown model after
`core.depth.materialize` (its blocks moved into the stack). Each trains a step (forward,
cross-entropy, backward, AdamW) on the same batches, in interleaved rounds so machine noise
hits them alike, one CPU thread. Prints the median seconds per step and the ratio to ``native``
(goal: grown <= 1.05, the wrappers' cost on a fossilized growth). On CUDA each timed run ends in
a synchronize, so it counts the GPU's work, not only its launches; there a small model's step is
bound by Python launching kernels, which is where the slot's hook could show; ``--precision
bf16`` runs the forward and loss under autocast, as Lightning's ``bf16-mixed`` does.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from esper_lightning.core.depth import DepthGrowth, materialize
from esper_lightning.core.engine import MorphogenesisEngine

VOCAB, BLOCK, BATCH = 256, 64, 32


class Block(nn.Module):
    """A user's own pre-norm block (nanoGPT's layout)."""

    def __init__(self, width: int, n_head: int = 4) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Module()
        self.mlp.c_fc, self.mlp.c_proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class UserGPT(nn.Module):
    def __init__(self, n_layer: int, width: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(BLOCK, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(n_layer))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class HFGPT2(nn.Module):
    """Hugging Face GPT-2 as a user wraps it (logits from the model's output)."""

    def __init__(self, n_layer: int, width: int) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        self.model = GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_embd=width, n_head=4,
                                                vocab_size=VOCAB, n_positions=BLOCK,
                                                bos_token_id=0, eos_token_id=0))

    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx, use_cache=False).logits


KINDS: dict[str, tuple[Callable[[int, int], nn.Module], str]] = {
    "user": (UserGPT, "blocks"), "gpt2": (HFGPT2, "model.transformer.h")}


def grown(kind: str, width: int) -> nn.Module:
    """The one-block model grown to four by fossilized identity blocks in a growth slot."""
    build, stack = KINDS[kind]
    model = build(1, width)
    engine = MorphogenesisEngine(model, growth=DepthGrowth(stack, blocks=3))
    model(torch.zeros(2, BLOCK, dtype=torch.long))  # the slot learns its width
    slot = next(iter(engine.slots.values()))
    assert slot.germinate("block_identity").passed and slot.advance().passed
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    slot.record_contribution(0.0)
    assert slot.fossilize().passed
    return model


def step_seconds(model: nn.Module, batches: list[tuple[Tensor, Tensor]],
                 precision: str) -> float:
    device = batches[0][0].device
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    synchronize()
    started = time.perf_counter()
    for x, y in batches:
        with autocast:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    synchronize()  # the GPU's queued work is part of the step
    return (time.perf_counter() - started) / len(batches)


def measure(kind: str, width: int, steps: int, rounds: int, device: str,
            precision: str) -> dict[str, float]:
    torch.manual_seed(0)
    models = {"native": KINDS[kind][0](4, width), "grown": grown(kind, width)}
    models["handed back"] = copy.deepcopy(models["grown"])
    materialize(models["handed back"])
    models = {name: model.to(device) for name, model in models.items()}
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, VOCAB, (BATCH, BLOCK), generator=generator).to(device),
                torch.randint(0, VOCAB, (BATCH, BLOCK), generator=generator).to(device))
               for _ in range(steps)]
    for model in models.values():  # warm up: allocator, first-call overheads
        step_seconds(model, batches[:3], precision)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            times[name].append(step_seconds(model, batches, precision))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--steps", type=int, default=20, help="steps per timed run")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved runs per model")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["32", "bf16"], default="32",
                        help="bf16: forward and loss under bfloat16 autocast")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device; accepted here: cpu")
    torch.set_num_threads(1)
    where = (torch.cuda.get_device_name(0) if args.device == "cuda"
             else platform.processor() or platform.machine())
    print(f"torch {torch.__version__}, {where}, precision {args.precision}, 1 CPU thread, "
          f"batch {BATCH} x {BLOCK} tokens, {args.rounds} rounds of {args.steps} steps")
    print(f"{'model':6s} {'width':>5s} {'native ms':>10s} {'grown ms':>9s} {'grown/native':>13s} "
          f"{'handed back/native':>19s}")
    for kind in KINDS:
        for width in args.widths:
            t = measure(kind, width, args.steps, args.rounds, args.device, args.precision)
            print(f"{kind:6s} {width:5d} {1e3 * t['native']:10.2f} {1e3 * t['grown']:9.2f} "
                  f"{t['grown'] / t['native']:13.3f} {t['handed back'] / t['native']:19.3f}")


if __name__ == "__main__":
    main()
