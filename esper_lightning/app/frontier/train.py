"""Training one unit of a frontier study: one arm at one rate on one episode, every budget.

A run is a byte-level `GPTHost` in a plain AdamW loop (the host's own optimizer groups), one CPU
thread or one CUDA device (the corpus's: `load_corpus`), batches from `data.text.StepBatches`
(step ``i``'s batch is a function of the episode's rng seed and ``i``), stepped through the
run's `core.compute.ComputeLedger` as every loop of the package is (``begin_step``: the step
metered once per architecture, its rate set at the middle of the batch; ``end_step``: charged,
and whether the budget is spent). The rate is a `schedule.BudgetSchedule`: a warmup of a fixed
amount of compute, a stable phase, and a linear decay over the last ``decay_fraction`` of the
run's own budget, so every budget ends fully decayed. The step that brings the FLOPs spent to
the budget is the last.

A growing arm (`arms.ArmSpec`) trains each budget as its own run: at the first step past
fraction ``τ`` of that budget it grows (`core.depth.grow`: new blocks on top, made by its growth
operator, joining the optimizer in their sources' param groups, with their sources' moments
under ``+moments``), the ledger meters the new architecture from the next step on
(``invalidate``), and under ``+rewarm`` its rate re-warms linearly from 0 over the study's
warmup compute after each growth (``ComputeLedger.rewarm``). It is born with its final depth's
residual-projection init.
A growth that also makes it wider (``G1w32-4w64``) widens it first (`core.width.widen`: the
function kept, AdamW moments carried into the new shapes, the split's draws from the unit's
growth stream), then adds the blocks, made from the widened ones.
A unit with a phase rate (``lr_phases``, `plan.Unit.phases`) trains each phase at its own peak
rate: at each growth every param group's base rate becomes the next phase's, and the rate
re-warms from 0 over the warmup compute, as under ``+rewarm`` (the new blocks' AdamW moments
start at zero, so their first steps at a full new rate would be the largest of the run;
``+steady`` changes the peak without the re-warm). The
schedule's shape (warmup, stable phase, decay over the last ``decay_fraction`` of the budget)
multiplies whichever base rate the phase has.

A fixed size trains each of its budgets as a **branched cooldown**: one run to its largest
budget, and at the step where a smaller budget's decay would begin the run's state (weights,
optimizer, step, its ledger's state) is saved, that budget's decay is trained from it (the
ledger's budget set to that budget's) and evaluated, and the state is put back. Warmup and
stable phase are the same at every budget (the warmup is absolute compute), so each branch is
the separate run of its budget step for step (`tests/test_app_frontier.py` checks it to the
last bit); the saving is every smaller budget's stable phase.

At the end of each budget the model is evaluated on every block of the plan's splits (mean
nats per byte over all tokens of the validation split, and of the test split in a final study).

A plan with ``curve_points`` also reads each run's **curve** (`CurveLog`): after the first step that
passes each of ``k / curve_points`` of its budget (k = 1, ..., the last the run's end), the model is
evaluated on the plan's ``curve_blocks`` blocks of the split its tables read (`Plan.curve_split`:
validation in tuning, test in a final) spread evenly over the split (`curve_subset`), and the point
``[FLOPs spent, tokens seen, nats]`` kept;
the row holds them (``curve``) and the FLOPs their forwards cost (``curve_flops``, metered as
validation compute in the run's ledger, never its training budget). An evaluation changes no
weight, draws no random number and its time is taken out of ``wall_s``, so a row with a curve
trains exactly as one without. In a branched cooldown a point the shared run passes is read
once and kept by every budget whose curve has it; inside a branch only that budget's curve is
read. A long run (`plan.Unit.schedule`) is one run of its budget on one decay from the end of
the warmup to the end (`long_schedule_of`), growing at ``τ`` of that budget.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from esper_lightning.app.frontier.plan import Plan, Shape, Unit
from esper_lightning.blueprints.block import init_block
from esper_lightning.core.compute import ComputeLedger
from esper_lightning.core.depth import DepthGrowth, grow
from esper_lightning.core.flops import FlopMeter
from esper_lightning.core.width import WidthGrowth, widen
from esper_lightning.data.text import (
    StepBatches,
    evaluation_starts,
    find_text_file,
    load_text_tokens,
    split_text,
    validation_blocks,
)
from esper_lightning.hosts.gpt import GPTConfig, GPTHost
from esper_lightning.schedule import BudgetSchedule, LRSchedule, set_base_lrs

__all__ = ["PHASE_SEPARATOR", "ROW_FIELDS", "Corpus", "CurveLog", "build_host", "curve_subset",
           "evaluate", "growth_rng_seed", "load_corpus", "long_schedule_of", "train_unit"]

#: Blocks per evaluation forward.
EVAL_BATCH = 256
#: The columns of a frontier row (`study.ROWS`), in order.
ROW_FIELDS = ("arm", "episode", "rng_seed", "lr", "budget", "budget_flops", "spent_flops",
              "steps", "params", "final_depth", "tokens", "data_passes", "wall_s",
              "validation_nats", "test_nats", "text_sha256", "lr_phases", "schedule", "curve",
              "curve_flops")
#: How a row writes its phase rates (``lr`` is then the first's; empty for one rate throughout).
PHASE_SEPARATOR = ";"
#: The ledger's key for a run's steps: the host trains in one mode, and what else changes its
#: architecture (a growth) says so (``ComputeLedger.invalidate``).
_STEPS = "train"


@dataclass(frozen=True)
class Corpus:
    """The training tokens and the evaluation blocks of each split, read once per worker."""

    train: Tensor
    blocks: dict[str, tuple[Tensor, Tensor]]
    sha256: str


def load_corpus(path: str | Path, shape: Shape, splits: tuple[str, ...],
                device: str | torch.device = "cpu") -> Corpus:
    """Read the text, split it (`split_text`) and cut every block of each split in ``splits``,
    all on ``device`` (where every run on this corpus trains)."""
    file = find_text_file(path, downloadable=False)
    tokens = load_text_tokens(file)
    parts = split_text(tokens)
    blocks = {name: tuple(t.to(device) for t in validation_blocks(getattr(parts, name),
                                                                  shape.block_size))
              for name in splits}
    return Corpus(parts.train.to(device), blocks, hashlib.sha256(file.read_bytes()).hexdigest())


def build_host(shape: Shape, depth: int, lr: float, rng_seed: int,
               init_depth: int | None = None, width: int | None = None) -> GPTHost:
    """A GPT of ``depth`` blocks (no slots) initialised from ``rng_seed``, its residual
    projections scaled for ``init_depth`` (None: ``depth``, a network born that deep), of
    ``width`` (None: the shape's) in heads of the shape's head width."""
    extra = (init_depth or depth) - depth
    width = width or shape.width
    heads = width // (shape.width // shape.n_head)
    config = GPTConfig(vocab_size=256, block_size=shape.block_size, n_layer=depth,
                       n_head=heads, n_embd=width, growth_slots=int(extra > 0),
                       growth_depth=max(extra, 1))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng_seed)
        return GPTHost(config, slots=(), lr=lr)


def curve_subset(blocks: tuple[Tensor, Tensor], count: int) -> tuple[Tensor, Tensor]:
    """``count`` of ``blocks`` spread evenly over them (all when there are no more), the ones
    `data.text.validation_blocks` keeps with ``max_blocks=count``."""
    x, y = blocks
    # The blocks as a text of one-token blocks: evaluation_starts' spreading rule, the one place
    # it is written.
    rows = torch.tensor(evaluation_starts(len(x) + 1, 1, count), device=x.device)
    return x[rows], y[rows]


@dataclass
class CurveLog:
    """The curves of a run's budgets in progress (module docstring).

    ``targets``: each budget's FLOPs still to pass, ascending; ``points``: its
    ``(FLOPs spent, tokens seen, nats)`` read so far; ``flops``: what its points' forwards
    cost; ``active``: the budgets read now (a branch reads its own alone); ``seconds``: the
    time spent evaluating, which the run's clock leaves out."""

    blocks: tuple[Tensor, Tensor]
    tokens_per_step: int
    targets: dict[float, list[float]]
    points: dict[float, list[tuple[float, int, float]]]
    flops: dict[float, float]
    active: set[float]
    seconds: float = 0.0

    @classmethod
    def of(cls, plan: Plan, corpus: Corpus, budgets: tuple[float, ...]) -> CurveLog | None:
        """The log of ``budgets`` under ``plan`` (None: the plan reads no curves)."""
        if not plan.curve_points:
            return None
        n = plan.curve_points
        return cls(curve_subset(corpus.blocks[plan.curve_split], plan.curve_blocks),
                   plan.shape.batch_size * plan.shape.block_size,
                   {b: [b * k / n for k in range(1, n)] + [b] for b in budgets},  # b exact
                   {b: [] for b in budgets}, dict.fromkeys(budgets, 0.0), set(budgets))

    def read(self, run: Run) -> None:
        """After a step: one evaluation for every active budget that passed a target (each
        keeps one point however many of its targets the step passed)."""
        due = [b for b in sorted(self.active) if self.targets[b] and self.targets[b][0]
               <= run.spent]
        if not due:
            return
        device = next(run.host.parameters()).device
        if device.type == "cuda":  # the queued training steps are the run's time, not this
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        nats = evaluate(run.host, self.blocks)
        x = self.blocks[0]
        cost = sum(run.ledger.meter.forward(run.host, x[i:i + EVAL_BATCH])
                   for i in range(0, len(x), EVAL_BATCH))
        run.ledger.charge_validation(cost)  # validation compute: never the budget's
        for budget in due:
            while self.targets[budget] and self.targets[budget][0] <= run.spent:
                self.targets[budget].pop(0)
            self.points[budget].append((run.spent, run.step * self.tokens_per_step, nats))
            self.flops[budget] += cost
        self.seconds += time.perf_counter() - started


@dataclass
class Run:
    """One training run in progress: the host, its optimizer, how far it has come (its
    `ComputeLedger`: FLOPs spent, the rate's schedule and re-warm) and its curves (None:
    not read)."""

    host: GPTHost
    optimizer: torch.optim.Optimizer
    ledger: ComputeLedger = field(default_factory=ComputeLedger)
    step: int = 0
    seconds: float = 0.0
    curve: CurveLog | None = None

    @property
    def spent(self) -> float:
        """Training FLOPs spent (the ledger's)."""
        return self.ledger.train_flops

    def state(self) -> dict[str, Any]:
        """Everything a branch changes, copied (a branched cooldown starts and ends here)."""
        return {"host": copy.deepcopy(self.host.state_dict()),
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "ledger": self.ledger.state_dict(), "step": self.step, "seconds": self.seconds}

    def restore(self, state: dict[str, Any]) -> None:
        """Back to a saved `state`: weights, optimizer, ledger (its budget is set by the next
        `train_until`), step and clock."""
        self.host.load_state_dict(state["host"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.ledger.load_state_dict(state["ledger"])
        self.step, self.seconds = state["step"], state["seconds"]


def start_run(shape: Shape, depth: int, lr: float, rng_seed: int, schedule: BudgetSchedule,
              init_depth: int | None = None, device: torch.device | None = None,
              meter: FlopMeter | None = None, width: int | None = None) -> Run:
    """A fresh run, its host (``width`` wide; None: the shape's) initialised on the CPU (the
    same weights on every device) and moved to ``device`` before its optimizer is made; its
    ledger sets the rate by ``schedule`` and meters with ``meter`` (one shared by a worker's
    runs: one meta pass per architecture)."""
    host = build_host(shape, depth, lr, rng_seed, init_depth, width).to(device)
    optimizer = host.configure_optimizers()
    set_base_lrs(optimizer.param_groups)
    return Run(host, optimizer, ComputeLedger(schedule=schedule, meter=meter))


def train_until(run: Run, batches: StepBatches, budget: float,
                stop: Callable[[float], bool] | None = None,
                grow: Callable[[Run], bool] | None = None) -> None:
    """Train ``run`` until its ledger's budget, set to ``budget``, is spent, or until
    ``stop(the FLOPs at the middle of the next batch)`` says to branch there. ``grow(run)``
    runs before each step and says whether it changed the host (the ledger then meters it
    again). Each step goes through the ledger: ``begin_step`` meters it and sets the rate
    (its schedule's at the middle of the batch, times a re-warm after a growth), ``end_step``
    charges it. At a branch point the rate ``begin_step`` set is never stepped with: the
    branch's first ``begin_step`` sets its own."""
    host, optimizer, ledger = run.host, run.optimizer, run.ledger
    ledger.set_budget(budget)
    host.train()
    evaluating = run.curve.seconds if run.curve is not None else 0.0
    started = time.perf_counter()
    while not ledger.exhausted:
        if grow is not None and grow(run):
            ledger.invalidate()
        x, y = batches(run.step)
        cost = ledger.begin_step(host, x, key=_STEPS, param_groups=optimizer.param_groups)
        if stop is not None and stop(ledger.middle(cost.total)):
            break
        loss = F.cross_entropy(host(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ledger.end_step(cost)
        run.step += 1
        if run.curve is not None:
            run.curve.read(run)
    device = next(host.parameters()).device
    if device.type == "cuda":  # the clock stops when the GPU's queued steps are done
        torch.cuda.synchronize(device)
    if run.curve is not None:  # the curve's evaluations are not training time
        evaluating = run.curve.seconds - evaluating
    run.seconds += time.perf_counter() - started - evaluating


@torch.no_grad()
def evaluate(host: GPTHost, blocks: tuple[Tensor, Tensor]) -> float:
    """Mean cross-entropy in nats per token over every block (all tokens weigh alike)."""
    host.eval()
    x, y = blocks
    total = 0.0
    for i in range(0, len(x), EVAL_BATCH):
        logits = host(x[i:i + EVAL_BATCH])
        total += float(F.cross_entropy(logits.flatten(0, 1), y[i:i + EVAL_BATCH].flatten(),
                                       reduction="sum"))
    host.train()
    return total / y.numel()


def growth_rng_seed(rng_seed: int, depth: int) -> int:
    """The rng seed of the growth event of the episode ``rng_seed`` that grows a host of
    ``depth`` blocks (a stream of its own, apart from the episode's weights and batches)."""
    return (rng_seed * 1_000_003 + 0x6A0 * (depth + 1)) % 2**63


def schedule_of(plan: Plan) -> BudgetSchedule:
    return BudgetSchedule(LRSchedule("wsd", decay_fraction=plan.decay_fraction,
                                     min_lr_ratio=plan.min_lr_ratio), plan.warmup_flops)


def long_schedule_of(plan: Plan, decay: str, budget: float) -> BudgetSchedule:
    """One long schedule of ``budget`` FLOPs: the plan's warmup, then one decay (``cosine``: a
    half cosine; ``linear``) from its end to ``min_lr_ratio`` at the end of the run."""
    kind = {"cosine": "cosine", "linear": "wsd"}[decay]  # a WSD decaying all the way is linear
    return BudgetSchedule(LRSchedule(kind, decay_fraction=1.0 - plan.warmup_flops / budget,
                                     min_lr_ratio=plan.min_lr_ratio), plan.warmup_flops)


def train_unit(unit: Unit, plan: Plan, corpus: Corpus,
               meter: FlopMeter | None = None) -> list[dict[str, Any]]:
    """Train ``unit`` (every budget of it) and return one row per budget (`ROW_FIELDS`)."""
    meter = meter or FlopMeter()
    if unit.schedule is not None:  # one long run, whether the arm grows or not
        (budget,) = unit.budgets
        return [_train_growing(unit, plan, corpus, meter, budget,
                               long_schedule_of(plan, unit.schedule, budget))]
    if not unit.arm.branches:
        return [_train_growing(unit, plan, corpus, meter, budget)
                for budget in sorted(unit.budgets)]
    schedule = schedule_of(plan)
    batches = StepBatches(corpus.train, plan.shape.block_size, plan.shape.batch_size,
                          unit.rng_seed)
    run = start_run(plan.shape, unit.arm.final_depth, unit.lr, unit.rng_seed, schedule,
                    device=corpus.train.device, meter=meter,
                    width=unit.arm.stage_widths(plan.shape.width)[-1])
    run.curve = CurveLog.of(plan, corpus, unit.budgets)
    largest = max(unit.budgets)
    rows = []
    for budget in sorted(unit.budgets):
        _read_curves(run, {b for b in unit.budgets if b >= budget})  # the shared run's
        if budget == largest:
            train_until(run, batches, largest)
            rows.append(_row(unit, plan, corpus, run, budget))
            break
        # Up to the first step at which this budget's rate leaves the largest budget's.
        train_until(run, batches, largest, stop=lambda middle, b=budget: (
            schedule.multiplier(middle, b) != schedule.multiplier(middle, largest)))
        saved = run.state()
        _read_curves(run, {budget})  # the branch is this budget's run alone
        train_until(run, batches, budget)
        rows.append(_row(unit, plan, corpus, run, budget))
        run.restore(saved)
    return rows


def _read_curves(run: Run, budgets: set[float]) -> None:
    """Read the curves of ``budgets`` alone from now on (a run without curves reads none)."""
    if run.curve is not None:
        run.curve.active = budgets


def _train_growing(unit: Unit, plan: Plan, corpus: Corpus, meter: FlopMeter, budget: float,
                   schedule: BudgetSchedule | None = None) -> dict[str, Any]:
    """One run of an arm to ``budget`` on ``schedule`` (None: the plan's, `schedule_of`),
    growing at each of its events (a fixed size, on a long schedule, has none)."""
    arm, base = unit.arm, plan.shape.width
    events = arm.events(budget, base)
    init = partial(init_block, depth=arm.final_depth)
    moments = "copy" if "moments" in arm.options else "fresh"
    # Phase rates re-warm after each growth unless the arm says +steady.
    rewarms = "rewarm" in arm.options or bool(unit.phases and "steady" not in arm.options)

    def grow_due(run: Run) -> bool:
        if not events or run.spent < events[0][0]:
            return False
        _, blocks, wider = events.pop(0)
        device = corpus.train.device
        # An operator that draws (random) draws from the unit's own stream, so a row never
        # depends on what its worker trained before.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            rng_seed = growth_rng_seed(unit.rng_seed, len(run.host.blocks))
            torch.manual_seed(rng_seed)
            if wider > 1:  # first wider, so the new blocks are made from the widened ones
                widen(run.host, WidthGrowth(
                    wider, stack="blocks", rng_seed=rng_seed,
                    moments="reset" if "reset" in arm.options else "copy",
                    new_units="clone" if "clone" in arm.options else "random"), run.optimizer)
            if blocks:
                grow(run.host, DepthGrowth("blocks", blocks=blocks, init=init,
                                           moments=moments), str(arm.operator), run.optimizer)
        if rewarms:
            run.ledger.rewarm(plan.warmup_flops)
        if unit.phases:  # the next phase's peak rate; the schedule multiplies it as before
            rate = unit.phases[len(arm.events(budget, base)) - len(events)]
            for group in run.optimizer.param_groups:
                group["initial_lr"] = rate
        return True

    run = start_run(plan.shape, arm.depths[0], unit.lr, unit.rng_seed,
                    schedule or schedule_of(plan), arm.final_depth, device=corpus.train.device,
                    meter=meter, width=arm.stage_widths(base)[0])
    run.curve = CurveLog.of(plan, corpus, (budget,))
    batches = StepBatches(corpus.train, plan.shape.block_size, plan.shape.batch_size,
                          unit.rng_seed)
    train_until(run, batches, budget, grow=grow_due)
    return _row(unit, plan, corpus, run, budget)


def _row(unit: Unit, plan: Plan, corpus: Corpus, run: Run, budget: float) -> dict[str, Any]:
    tokens = run.step * plan.shape.batch_size * plan.shape.block_size
    losses = {f"{name}_nats": evaluate(run.host, corpus.blocks[name]) for name in plan.splits}
    return {
        "arm": unit.arm.name, "episode": unit.episode, "rng_seed": unit.rng_seed, "lr": unit.lr,
        "budget": budget / plan.base_flops, "budget_flops": budget, "spent_flops": run.spent,
        "steps": run.step, "params": sum(p.numel() for p in run.host.parameters()),
        "final_depth": len(run.host.blocks), "tokens": tokens,
        "data_passes": tokens / len(corpus.train), "wall_s": run.seconds,
        "validation_nats": losses.get("validation_nats"), "test_nats": losses.get("test_nats"),
        "text_sha256": corpus.sha256,
        "lr_phases": unit.phases or None, "schedule": unit.schedule,
        "curve": tuple(run.curve.points[budget]) if run.curve is not None else None,
        "curve_flops": run.curve.flops[budget] if run.curve is not None else None,
    }
