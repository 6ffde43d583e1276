"""Growth that saves compute: a single-core sizing pilot with `GPTHost` on Shakespeare bytes.

Does growing a byte-level GPT from 1 block to 4 reach the 4-block host's loss with fewer
training FLOPs? Three subcommands (each has its own --help):

  time       FLOPs per training step (forward + backward, counted by torch's FlopCounterMode)
             and seconds per step of the 1-block and 4-block hosts at candidate sizes.
  train      train arms until their cumulative training FLOPs reach a budget and append one JSON
             line per (arm, lr, rng_seed). Arms: ``s1`` / ``s4`` (born with 1 / 4 blocks; any
             ``sN``), ``stack-copy-TAU`` and ``stack-identity-TAU`` (1 block for fraction TAU of
             the budget, then grown to 4 blocks by appending copies of the trained block;
             ``identity`` zeroes the copies' attention and MLP output projections, so the grown
             network computes the same function at birth). A suffix ``@F`` trains to F times the
             budget: ``s4@0.5``.
  summarize  tables from those JSON lines: final loss per (arm, lr), paired differences between
             arms over shared rng seeds with t-based 95 % CIs, and the FLOPs an arm needs to reach
             another arm's final loss on its loss-vs-FLOPs curve.

An episode is one rng seed: it fixes the initial weights and the order of training blocks (random
offsets into the first 90 % of the text), shared by every arm. The learning rate follows
warmup-stable-decay indexed by the fraction of the arm's own budget spent, so every arm is fully
decayed exactly at its budget; a grown arm keeps its schedule and its optimizer, the new blocks
joining with fresh AdamW moments (or copies of their source block's, --copy-moments).
Validation: the first --val-tokens bytes of the held-out last 10 %, cut into blocks; loss in
nats per byte (bits per byte = nats / ln 2). Everything runs on one thread: set OMP_NUM_THREADS=1.

Example:
  OMP_NUM_THREADS=1 python scripts/growth_pilot.py time --widths 32 64 --block-sizes 32 64
  OMP_NUM_THREADS=1 python scripts/growth_pilot.py train --width 64 --budget 3200 \\
      --arms s1 s4 s4@0.5 stack-copy-0.5 --lrs 2e-3 4e-3 --rng-seeds 100 --out tune.jsonl
  python scripts/growth_pilot.py summarize tune.jsonl --pair s4:s1 --reach stack-copy-0.5:s4
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from esper_lightning.data.text import load_text_tokens, split_text, validation_blocks
from esper_lightning.hosts.gpt import GPTConfig, GPTHost

DATA = Path("/work/shared/data/shakespeare/shakespeare.txt")
#: Depth of the small host and of the host it grows into; the budget's unit is a step of the
#: grown host ("S4 steps"). ``--grown-depth`` sets BIG for a run (2: the lm-grow-cpu pilot,
#: whose budgets are then in S2 steps).
SMALL, BIG = 1, 4
ARM = re.compile(
    r"^(?:s(?P<static>[1-9]\d*)|stack-(?P<init>copy|identity)-(?P<tau>0?\.\d+))"
    r"(?:@(?P<fraction>\d*\.?\d+))?$"
)


@dataclass(frozen=True)
class Shape:
    """Everything about a training step except depth."""

    width: int = 64
    n_head: int = 4
    block_size: int = 64
    batch: int = 32

    def config(self, n_layer: int) -> GPTConfig:
        return GPTConfig(vocab_size=256, block_size=self.block_size, n_layer=n_layer,
                         n_head=self.n_head, n_embd=self.width)


@dataclass(frozen=True)
class Schedule:
    """Warmup-stable-decay over the fraction of the budget spent."""

    warmup: float = 0.03
    decay: float = 0.2
    final: float = 0.0  # last learning rate as a fraction of the peak

    def factor(self, frac: float) -> float:
        """Multiplier of the peak learning rate at budget fraction ``frac`` in [0, 1]."""
        if frac < self.warmup:
            return frac / self.warmup
        if frac <= 1.0 - self.decay:
            return 1.0
        left = max(0.0, 1.0 - frac) / self.decay  # 1 at the start of the decay, 0 at the end
        return self.final + (1.0 - self.final) * left


@dataclass(frozen=True)
class Arm:
    """One way to spend the budget: a static depth, or SMALL blocks grown to BIG at ``tau``."""

    name: str
    n_layer: int  # depth at birth
    tau: float | None = None  # budget fraction at which the host grows; None: never
    init: str = ""  # "copy" or "identity" for a grown arm
    fraction: float = 1.0  # share of the budget this arm trains for

    def phases(self, budget: float) -> list[tuple[int, float]]:
        """(depth, cumulative FLOPs at which that depth stops training) in order."""
        total = self.fraction * budget
        if self.tau is None:
            return [(self.n_layer, total)]
        return [(SMALL, self.tau * total), (BIG, total)]


def parse_arm(text: str) -> Arm:
    """``s1``, ``s4``, ``stack-copy-0.5``, ``stack-identity-0.25``, any of them with ``@0.5``."""
    match = ARM.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"bad arm {text!r}; accepted: sN, stack-copy-TAU, stack-identity-TAU (0 < TAU < 1), "
            "optionally followed by @FRACTION of the budget (e.g. s4@0.5)")
    fraction = float(match["fraction"] or 1.0)
    if fraction <= 0:
        raise argparse.ArgumentTypeError(f"bad arm {text!r}: budget fraction must be > 0")
    if match["static"]:
        return Arm(text, int(match["static"]), fraction=fraction)
    tau = float(match["tau"])
    if not 0.0 < tau < 1.0:
        raise argparse.ArgumentTypeError(f"bad arm {text!r}: TAU must be in (0, 1)")
    return Arm(text, SMALL, tau=tau, init=match["init"], fraction=fraction)


# ------------------------------------------------------------------------------ model and data


def build_host(shape: Shape, n_layer: int, rng_seed: int, lr: float = 1e-3) -> GPTHost:
    """A slot-free `GPTHost` whose weights depend only on ``rng_seed`` and its shape."""
    torch.manual_seed(rng_seed)
    return GPTHost(shape.config(n_layer), slots=[], lr=lr)


def token_loss(host: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    logits = host(x)  # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def sample_batch(train: Tensor, shape: Shape, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """``batch`` blocks at uniformly random offsets: inputs and next-byte targets, [B, T] each."""
    offsets = torch.randint(len(train) - shape.block_size, (shape.batch,), generator=gen)
    chunk = train[offsets[:, None] + torch.arange(shape.block_size + 1)].long()  # [B, T + 1]
    return chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def evaluate(host: nn.Module, val: tuple[Tensor, Tensor], batch: int = 64) -> float:
    """Mean cross-entropy in nats per byte over all validation blocks (equal-length blocks)."""
    host.eval()
    x, y = val
    total = sum(token_loss(host, x[i:i + batch], y[i:i + batch]).item() * len(x[i:i + batch])
                for i in range(0, len(x), batch))
    host.train()
    return total / len(x)


@cache
def flops_per_step(shape: Shape, n_layer: int) -> int:
    """Forward + backward FLOPs of one training step, counted once per architecture.

    Counted under the math attention kernel: the counter does not see the CPU's fused attention
    kernel and would leave attention's matrix products out; the arithmetic is the same.
    """
    host = build_host(shape, n_layer, rng_seed=0)
    x = torch.zeros(shape.batch, shape.block_size, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        token_loss(host, x, x).backward()
    return int(counter.get_total_flops())


def load_corpus(path: Path, val_tokens: int, block_size: int) -> tuple[Tensor, tuple]:
    """Training head (uint8 bytes) and ``val_tokens // block_size`` validation blocks spread
    over the validation split (`split_text`)."""
    train, held_out, _ = split_text(load_text_tokens(path))  # the test split stays unread
    val = validation_blocks(held_out, block_size, max_blocks=max(1, val_tokens // block_size))
    return train, val


# ------------------------------------------------------------------------------------- growth


def grow(host: GPTHost, opt: torch.optim.Optimizer, depth: int, init: str,
         copy_moments: bool = False) -> None:
    """Append copies of the trained blocks (block ``i`` copies block ``i mod n``) up to ``depth``.

    ``identity`` zeroes each copy's output projections, so its residual branches add nothing
    until trained. The new parameters join the optimizer group their kind belongs to.
    """
    n = len(host.blocks)
    for i in range(n, depth):
        source = host.blocks[i % n]
        block = copy.deepcopy(source)
        if init == "identity":
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.zeros_(proj.weight)
                nn.init.zeros_(proj.bias)
        host.blocks.append(block)
        for p_new, p_src in zip(block.parameters(), source.parameters(), strict=True):
            _join_optimizer(opt, p_new, p_src if copy_moments else None)


def _join_optimizer(opt: torch.optim.Optimizer, param: nn.Parameter,
                    moments_from: nn.Parameter | None) -> None:
    # Matrices decay, vectors do not: the rule GPTHost.configure_optimizers applies to blocks.
    decays = param.dim() >= 2
    group = next(g for g in opt.param_groups if (g["weight_decay"] > 0) == decays)
    group["params"].append(param)
    if moments_from is not None and moments_from in opt.state:
        opt.state[param] = {k: v.clone() for k, v in opt.state[moments_from].items()}


# ----------------------------------------------------------------------------------- training


@dataclass
class Episode:
    """One arm's training run: the host, its optimizer and data, and what the run accumulates."""

    host: GPTHost
    opt: torch.optim.Optimizer
    shape: Shape
    schedule: Schedule
    total: float  # this arm's budget in FLOPs
    marks: list[float]  # FLOPs at which to evaluate, ascending
    train: Tensor
    val: tuple[Tensor, Tensor]
    gen: torch.Generator  # training-block offsets
    spent: float = 0.0
    steps: dict[str, int] = field(default_factory=dict)  # per depth
    train_s: dict[str, float] = field(default_factory=dict)  # per depth, evaluation excluded
    curve: list[list[float]] = field(default_factory=list)  # [FLOPs spent, val loss]
    growth: dict[str, float] | None = None

    def evaluate(self) -> None:
        self.curve.append([self.spent, evaluate(self.host, self.val)])


def train_arm(arm: Arm, shape: Shape, lr: float, rng_seed: int, budget: float,
              data: tuple[Tensor, tuple], schedule: Schedule = Schedule(), evals: int = 20,
              copy_moments: bool = False) -> dict[str, Any]:
    """Train one arm for one episode until its FLOP budget is spent; return its JSON record."""
    start, cpu_start = time.perf_counter(), time.process_time()
    host = build_host(shape, arm.n_layer, rng_seed, lr)
    total = arm.fraction * budget
    ep = Episode(host, host.configure_optimizers(), shape, schedule, total,
                 marks=[total * k / evals for k in range(1, evals + 1)], train=data[0],
                 val=data[1], gen=torch.Generator().manual_seed(rng_seed))
    ep.evaluate()
    for i, (depth, until) in enumerate(arm.phases(budget)):
        if i > 0:
            before = evaluate(host, ep.val)
            grow(host, ep.opt, depth, arm.init, copy_moments)
            ep.growth = {"flops": ep.spent, "before": before, "after": evaluate(host, ep.val)}
        _train_phase(ep, depth, until, lr)
    if ep.marks:  # rounding left the last mark a hair beyond the last step
        ep.evaluate()
    return _record(arm, ep, lr, rng_seed, budget, wall_s=time.perf_counter() - start,
                   cpu_s=time.process_time() - cpu_start,  # wall/cpu > 1: a shared machine
                   schedule=asdict(schedule), copy_moments=copy_moments)


def _train_phase(ep: Episode, depth: int, until: float, peak_lr: float) -> None:
    """Steps at ``depth`` until the step nearest to ``until`` cumulative FLOPs, evaluating at
    each mark passed."""
    flops = flops_per_step(ep.shape, depth)
    n_steps = max(0, round((until - ep.spent) / flops))
    tic = time.perf_counter()
    for _ in range(n_steps):
        lr = peak_lr * ep.schedule.factor(min(1.0, (ep.spent + flops / 2) / ep.total))
        for group in ep.opt.param_groups:
            group["lr"] = lr
        x, y = sample_batch(ep.train, ep.shape, ep.gen)
        ep.opt.zero_grad(set_to_none=True)
        token_loss(ep.host, x, y).backward()
        ep.opt.step()
        ep.spent += flops
        while ep.marks and ep.spent >= ep.marks[0] - flops / 2:
            ep.marks.pop(0)
            toc = time.perf_counter()
            ep.evaluate()
            tic += time.perf_counter() - toc  # evaluation is not training time
    ep.steps[str(depth)] = ep.steps.get(str(depth), 0) + n_steps
    ep.train_s[str(depth)] = ep.train_s.get(str(depth), 0.0) + time.perf_counter() - tic


def _record(arm: Arm, ep: Episode, lr: float, rng_seed: int, budget: float,
            **extra: Any) -> dict[str, Any]:
    depths = sorted({d for d, _ in arm.phases(budget)} | {BIG})  # BIG: the budget's unit
    tokens = sum(ep.steps.values()) * ep.shape.batch * ep.shape.block_size
    final = ep.curve[-1][1]
    return {
        "arm": arm.name, "tau": arm.tau, "init": arm.init, "fraction": arm.fraction,
        "lr": lr, "rng_seed": rng_seed, "shape": asdict(ep.shape),
        "budget_flops": budget, "budget_s4_steps": budget / flops_per_step(ep.shape, BIG),
        "flops_spent": ep.spent, "steps": ep.steps,
        "flops_per_step": {str(d): flops_per_step(ep.shape, d) for d in depths},
        "sec_per_step": {d: ep.train_s[d] / max(1, n) for d, n in ep.steps.items()},
        "train_s": sum(ep.train_s.values()), "tokens_seen": tokens,
        "corpus_passes": tokens / len(ep.train), "curve": ep.curve, "growth": ep.growth,
        "final_loss": final, "final_bpb": final / math.log(2), **extra,
    }


# ------------------------------------------------------------------------------------- timing


def time_steps(shape: Shape, n_layer: int, steps: int = 20, warmup: int = 3) -> dict[str, Any]:
    """FLOPs and mean wall seconds of one training step (random bytes: speed ignores content)."""
    host = build_host(shape, n_layer, rng_seed=0)
    opt = host.configure_optimizers()
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(256, (200_000,), generator=gen, dtype=torch.uint8)
    for i in range(warmup + steps):
        if i == warmup:
            tic = time.perf_counter()
        x, y = sample_batch(data, shape, gen)
        opt.zero_grad(set_to_none=True)
        token_loss(host, x, y).backward()
        opt.step()
    sec = (time.perf_counter() - tic) / steps
    flops = flops_per_step(shape, n_layer)
    params = sum(p.numel() for p in host.parameters())  # the tied head counts once
    return {**asdict(shape), "n_layer": n_layer, "params": params, "flops_per_step": flops,
            "sec_per_step": sec, "gflop_per_s": flops / sec / 1e9}


# ---------------------------------------------------------------------------------- summaries


def t_interval(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Student-t confidence interval of the mean; (nan, nan) below two values."""
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    sem = float(np.std(values, ddof=1)) / math.sqrt(n)
    if sem == 0.0:
        return float(values.mean()), float(values.mean())
    low, high = stats.t.interval(confidence, n - 1, loc=float(values.mean()), scale=sem)
    return float(low), float(high)


def flops_to_reach(curve: list[list[float]], target: float) -> float | None:
    """First FLOPs at which a loss curve reaches ``target``, linear between evaluations."""
    for i, (flops, loss) in enumerate(curve):
        if loss <= target:
            if i == 0:
                return flops
            f0, l0 = curve[i - 1]
            return f0 + (flops - f0) * (l0 - target) / (l0 - loss)
    return None


def best_lrs(records: list[dict]) -> dict[str, float]:
    """Per arm, the learning rate with the lowest mean final loss over its episodes."""
    means: dict[tuple[str, float], list[float]] = {}
    for r in records:
        means.setdefault((r["arm"], r["lr"]), []).append(r["final_loss"])
    best: dict[str, tuple[float, float]] = {}
    for (arm, lr), losses in means.items():
        if arm not in best or np.mean(losses) < best[arm][1]:
            best[arm] = (lr, float(np.mean(losses)))
    return {arm: lr for arm, (lr, _) in best.items()}


def lr_table(records: list[dict]) -> list[str]:
    lines = ["| arm | lr | episodes | mean final loss (nats/byte) | per episode | "
             "wall (cpu) s/episode | steps (depth: n) | corpus passes |",
             "|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in records:
        groups.setdefault((r["arm"], r["lr"]), []).append(r)
    for (arm, lr), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["rng_seed"])
        losses = ", ".join(f"{r['rng_seed']}: {r['final_loss']:.4f}" for r in rs)
        wall = np.mean([r["wall_s"] for r in rs])
        cpu = np.mean([r.get("cpu_s", math.nan) for r in rs])  # older records lack it
        lines.append(f"| {arm} | {lr:g} | {len(rs)} | {np.mean([r['final_loss'] for r in rs]):.4f}"
                     f" | {losses} | {wall:.0f} ({cpu:.0f}) | {rs[0]['steps']} | "
                     f"{rs[0]['corpus_passes']:.2f} |")
    return lines


def _by_seed(records: list[dict], arm: str, lr: float) -> dict[int, dict]:
    return {r["rng_seed"]: r for r in records if r["arm"] == arm and r["lr"] == lr}


def paired_table(records: list[dict], pairs: list[tuple[str, str]],
                 lrs: dict[str, float]) -> list[str]:
    """Final loss of A minus B over shared rng seeds: mean, t 95 % CI, per seed."""
    lines = ["| A − B | lr A / lr B | pairs | mean Δ loss [95 % t CI] | per seed |",
             "|---|---|---|---|---|"]
    for a, b in pairs:
        ra, rb = _by_seed(records, a, lrs[a]), _by_seed(records, b, lrs[b])
        seeds = sorted(set(ra) & set(rb))
        d = np.array([ra[s]["final_loss"] - rb[s]["final_loss"] for s in seeds])
        low, high = t_interval(d)
        each = ", ".join(f"{s}: {x:+.4f}" for s, x in zip(seeds, d, strict=True))
        lines.append(f"| {a} − {b} | {lrs[a]:g} / {lrs[b]:g} | {len(d)} | "
                     f"{d.mean() if len(d) else math.nan:+.4f} [{low:+.4f}, {high:+.4f}] | "
                     f"{each} |")
    return lines


def reach_table(records: list[dict], pairs: list[tuple[str, str]],
                lrs: dict[str, float]) -> list[str]:
    """FLOPs A needs to reach B's final loss, as a fraction of B's budget, per shared seed; the
    mean and CI cover only the episodes where A got there."""
    lines = ["| A reaches B | reached / pairs | mean FLOPs / B's budget where reached "
             "[95 % t CI] | per seed |", "|---|---|---|---|"]
    for a, b in pairs:
        ra, rb = _by_seed(records, a, lrs[a]), _by_seed(records, b, lrs[b])
        seeds = sorted(set(ra) & set(rb))
        ratios = {}
        for s in seeds:
            need = flops_to_reach(ra[s]["curve"], rb[s]["final_loss"])
            ratios[s] = None if need is None else need / (rb[s]["fraction"] * rb[s]["budget_flops"])
        got = np.array([x for x in ratios.values() if x is not None])
        low, high = t_interval(got)
        each = ", ".join(f"{s}: {'never' if x is None else f'{x:.3f}'}" for s, x in ratios.items())
        mean = f"{got.mean():.3f}" if len(got) else "never"
        lines.append(f"| {a} → {b} | {len(got)} / {len(seeds)} | {mean} [{low:.3f}, {high:.3f}] | "
                     f"{each} |")
    return lines


def load_records(paths: list[Path]) -> dict[str, list[dict]]:
    """JSON-line records grouped by shape and budget (one table set per group)."""
    groups: dict[str, list[dict]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                key = f"shape {r['shape']}, budget {r['budget_s4_steps']:.0f} S{BIG} steps"
                groups.setdefault(key, []).append(r)
    return groups


# ---------------------------------------------------------------------------------------- CLI


def _pair(text: str) -> tuple[str, str]:
    parts = text.split(":")
    if len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"bad pair {text!r}; accepted: ARM_A:ARM_B (s4:s1)")
    return parts[0], parts[1]


def _lr_override(text: str) -> tuple[str, float]:
    arm, _, lr = text.partition("=")
    try:
        return arm, float(lr)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad lr {text!r}; accepted: ARM=LR (s4=2e-3)") from None


def _add_shape_args(p: argparse.ArgumentParser, many: bool) -> None:
    nargs = "+" if many else None
    p.add_argument("--widths" if many else "--width", type=int, nargs=nargs,
                   default=[32, 48, 64] if many else 64, help="residual width n_embd")
    p.add_argument("--block-sizes" if many else "--block-size", type=int, nargs=nargs,
                   default=[32, 64] if many else 64, help="context length in bytes")
    p.add_argument("--n-head", type=int, default=4, help="attention heads (must divide width)")
    p.add_argument("--batch", type=int, default=32, help="blocks per training step")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grown-depth", type=int, default=BIG,
                        help="blocks of the grown host and of the budget's unit step (default 4)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("time", help="FLOPs and seconds per step at candidate sizes")
    _add_shape_args(p, many=True)
    p.add_argument("--steps", type=int, default=20, help="timed steps per size (after 3 warm)")
    p = sub.add_parser("train", help="train arms to a FLOP budget, append JSON lines")
    _add_shape_args(p, many=False)
    p.add_argument("--budget", type=float, required=True,
                   help="budget C in grown-host steps (S4 steps: of the 4-block host by default)")
    p.add_argument("--arms", type=parse_arm, nargs="+", required=True,
                   help="s1, s4, stack-copy-TAU, stack-identity-TAU, each optionally @FRACTION")
    p.add_argument("--lrs", type=float, nargs="+", required=True, help="peak learning rates")
    p.add_argument("--rng-seeds", type=int, nargs="+", required=True, help="episodes")
    p.add_argument("--out", type=Path, required=True, help="JSON lines file to append to")
    p.add_argument("--evals", type=int, default=20, help="evaluations along the budget")
    p.add_argument("--val-tokens", type=int, default=32768, help="held-out bytes evaluated")
    p.add_argument("--warmup", type=float, default=0.03, help="warmup share of the budget")
    p.add_argument("--decay", type=float, default=0.2, help="final linear decay share")
    p.add_argument("--final-lr", type=float, default=0.0, help="last lr as a share of the peak")
    p.add_argument("--copy-moments", action="store_true",
                   help="grown blocks start with their source block's AdamW moments")
    p.add_argument("--data", type=Path, default=DATA, help="text file (byte tokens)")
    p = sub.add_parser("summarize", help="tables from JSON lines")
    p.add_argument("files", type=Path, nargs="+")
    p.add_argument("--pair", type=_pair, nargs="*", default=[], help="A:B final-loss differences")
    p.add_argument("--reach", type=_pair, nargs="*", default=[],
                   help="A:B, FLOPs A needs to reach B's final loss")
    p.add_argument("--lr", type=_lr_override, nargs="*", default=[],
                   help="ARM=LR to pair at (default: each arm's lowest mean final loss)")
    p.add_argument("--rng-seeds", type=int, nargs="*", help="only these episodes")
    return parser


def run_time(args: argparse.Namespace) -> None:
    print("| width | block | batch | depth | params | GFLOP/step | s/step | GFLOP/s | "
          "F4/F1 |\n|---|---|---|---|---|---|---|---|---|")
    for width in args.widths:
        for block_size in args.block_sizes:
            shape = Shape(width, args.n_head, block_size, args.batch)
            for depth in (SMALL, BIG):
                t = time_steps(shape, depth, args.steps)
                ratio = flops_per_step(shape, BIG) / flops_per_step(shape, SMALL)
                print(f"| {width} | {block_size} | {args.batch} | {depth} | {t['params']:,} | "
                      f"{t['flops_per_step'] / 1e9:.3f} | {t['sec_per_step']:.4f} | "
                      f"{t['gflop_per_s']:.1f} | {ratio:.2f} |", flush=True)


def run_train(args: argparse.Namespace) -> None:
    shape = Shape(args.width, args.n_head, args.block_size, args.batch)
    data = load_corpus(args.data, args.val_tokens, shape.block_size)
    budget = args.budget * flops_per_step(shape, BIG)
    schedule = Schedule(args.warmup, args.decay, args.final_lr)
    for rng_seed in args.rng_seeds:
        for arm in args.arms:
            for lr in args.lrs:
                record = train_arm(arm, shape, lr, rng_seed, budget, data, schedule,
                                   args.evals, args.copy_moments)
                with args.out.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"{arm.name} lr={lr:g} rng_seed={rng_seed}: final {record['final_loss']:.4f}"
                      f" nats/byte, {record['wall_s']:.0f} s, steps {record['steps']}", flush=True)


def run_summarize(args: argparse.Namespace) -> None:
    for key, records in load_records(args.files).items():
        if args.rng_seeds:
            records = [r for r in records if r["rng_seed"] in args.rng_seeds]
        lrs = {**best_lrs(records), **dict(args.lr)}
        print(f"\n### {key}\n")
        print("\n".join(lr_table(records)))
        missing = {a for pair in args.pair + args.reach for a in pair} - set(lrs)
        if missing:
            sys.exit(f"no records of arm(s) {', '.join(sorted(missing))} in {key}")
        if args.pair:
            print("\n" + "\n".join(paired_table(records, args.pair, lrs)))
        if args.reach:
            print("\n" + "\n".join(reach_table(records, args.reach, lrs)))


def main(argv: list[str] | None = None) -> None:
    global BIG  # one depth per invocation, read by every arm and table of the run
    args = make_parser().parse_args(argv)
    BIG = args.grown_depth
    torch.set_num_threads(1)
    {"time": run_time, "train": run_train, "summarize": run_summarize}[args.command](args)


if __name__ == "__main__":
    main()
