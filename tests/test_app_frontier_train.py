"""Training a frontier unit (`app.frontier.train`) steps through the run's `ComputeLedger`
(``begin_step``/``end_step``, the one budget stepping of the package) and reproduces, to the
last bit, the stepping the frontier wrote out for itself before (`_before_unit`, a copy of that
loop kept here as the reference): every step's loss, every group's learning rate and size, the
FLOPs spent after it, every validation charge and evaluation, and every row. The cases cover
what the stepping must carry: branched cooldowns (a branch saves and restores the run's state,
its ledger's with it), a growth mid-run (the ledger meters the new architecture), phase rates
with their re-warm, a widening, long schedules and validation curves (charged as validation,
never as training). What else a unit computes is tests/test_app_frontier.py's."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from esper_lightning.app.frontier import train
from esper_lightning.app.frontier.plan import parse_plan
from esper_lightning.blueprints.block import init_block
from esper_lightning.core.compute import ComputeLedger
from esper_lightning.core.depth import DepthGrowth, grow
from esper_lightning.core.flops import FlopMeter, structure
from esper_lightning.core.width import WidthGrowth, widen
from esper_lightning.data.text import StepBatches
from esper_lightning.schedule import apply_multiplier, set_base_lrs

TINY = {"width": 8, "n_head": 2, "block_size": 8, "batch_size": 4}


def _plan(**overrides) -> dict:
    plan = {"name": "tiny", "purpose": "tuning", "shape": TINY, "base_flops": 2e7,
            "budgets": [1, 2], "warmup_flops": 2e6, "arms": [{"arm": "S2", "lr": 1e-2}],
            "episodes": 1, "rng_seed": 5}
    plan.update(overrides)
    return plan


@pytest.fixture
def corpus(text_file: Path):
    return train.load_corpus(text_file, parse_plan(_plan()).shape, ("validation", "test"))


# --- the reference: the frontier's own stepping before the ledger stepped it -------------------
@dataclass
class _Run:
    """A run as the frontier kept it: its re-warm from the FLOPs of its last growth."""

    host: Any
    optimizer: torch.optim.Optimizer
    ledger: ComputeLedger
    step: int = 0
    seconds: float = 0.0
    grown_at: float | None = None
    curve: train.CurveLog | None = None

    @property
    def spent(self) -> float:
        return self.ledger.train_flops


def _before_start(shape, depth, lr, rng_seed, init_depth=None, width=None, meter=None) -> _Run:
    host = train.build_host(shape, depth, lr, rng_seed, init_depth, width)
    optimizer = host.configure_optimizers()
    set_base_lrs(optimizer.param_groups)
    return _Run(host, optimizer, ComputeLedger(meter=meter))


def _before_until(run: _Run, batches, schedule, budget: float,
                  stop: Callable[[float], bool] | None = None,
                  grow_due: Callable[[_Run], bool] | None = None,
                  rewarm: float | None = None) -> None:
    """The loop: metered per architecture, the rate at the batch's middle in FLOPs (the
    schedule's, times the re-warm since the last growth), charged as a plain number."""
    host, optimizer = run.host, run.optimizer
    host.train()
    arch = structure(host)
    while run.spent < budget:
        if grow_due is not None and grow_due(run):
            arch = structure(host)
        x, y = batches(run.step)
        cost = run.ledger.meter.training_step(host, x, None, arch)
        middle = run.spent + 0.5 * cost
        if stop is not None and stop(middle):
            break
        multiplier = schedule.multiplier(middle, budget)
        if rewarm is not None and run.grown_at is not None:
            multiplier *= min(1.0, (middle - run.grown_at) / rewarm)
        apply_multiplier(optimizer.param_groups, multiplier)
        loss = train.F.cross_entropy(host(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        run.ledger.end_step(cost)
        run.step += 1
        if run.curve is not None:
            run.curve.read(run)


def _before_unit(unit, plan, corpus) -> list[dict[str, Any]]:
    """A unit's rows: a long run, each budget of a growing arm alone, or branched cooldowns
    (the run's host, optimizer, step and FLOPs saved at each branch and put back after it)."""
    meter = FlopMeter()
    if unit.schedule is not None:
        (budget,) = unit.budgets
        return [_before_growing(unit, plan, corpus, meter, budget,
                                train.long_schedule_of(plan, unit.schedule, budget))]
    if not unit.arm.branches:
        return [_before_growing(unit, plan, corpus, meter, b) for b in sorted(unit.budgets)]
    schedule, largest, rows = train.schedule_of(plan), max(unit.budgets), []
    batches = StepBatches(corpus.train, plan.shape.block_size, plan.shape.batch_size,
                          unit.rng_seed)
    run = _before_start(plan.shape, unit.arm.final_depth, unit.lr, unit.rng_seed, meter=meter,
                        width=unit.arm.stage_widths(plan.shape.width)[-1])
    run.curve = train.CurveLog.of(plan, corpus, unit.budgets)
    for budget in sorted(unit.budgets):
        if run.curve is not None:
            run.curve.active = {b for b in unit.budgets if b >= budget}
        if budget == largest:
            _before_until(run, batches, schedule, largest)
            return [*rows, train._row(unit, plan, corpus, run, budget)]
        _before_until(run, batches, schedule, largest, stop=lambda middle, b=budget: (
            schedule.multiplier(middle, b) != schedule.multiplier(middle, largest)))
        saved = (copy.deepcopy(run.host.state_dict()), copy.deepcopy(run.optimizer.state_dict()),
                 run.step, run.spent)
        if run.curve is not None:
            run.curve.active = {budget}
        _before_until(run, batches, schedule, budget)
        rows.append(train._row(unit, plan, corpus, run, budget))
        run.host.load_state_dict(saved[0])
        run.optimizer.load_state_dict(copy.deepcopy(saved[1]))
        run.step = saved[2]
        run.ledger.restore_train_flops(saved[3])
    raise AssertionError("the largest budget ends the loop")


def _before_growing(unit, plan, corpus, meter, budget, schedule=None) -> dict[str, Any]:
    arm, base = unit.arm, plan.shape.width
    events = arm.events(budget, base)
    init = partial(init_block, depth=arm.final_depth)

    def grow_due(run: _Run) -> bool:
        if not events or run.spent < events[0][0]:
            return False
        _, blocks, wider = events.pop(0)
        with torch.random.fork_rng(devices=[]):
            rng_seed = train.growth_rng_seed(unit.rng_seed, len(run.host.blocks))
            torch.manual_seed(rng_seed)
            if wider > 1:
                widen(run.host, WidthGrowth(wider, stack="blocks", rng_seed=rng_seed, moments=(
                    "reset" if "reset" in arm.options else "copy"), new_units=(
                    "clone" if "clone" in arm.options else "random")), run.optimizer)
            if blocks:
                grow(run.host, DepthGrowth("blocks", blocks=blocks, init=init, moments=(
                    "copy" if "moments" in arm.options else "fresh")), str(arm.operator),
                    run.optimizer)
        run.grown_at = run.spent
        if unit.phases:
            rate = unit.phases[len(arm.events(budget, base)) - len(events)]
            for group in run.optimizer.param_groups:
                group["initial_lr"] = rate
        return True

    run = _before_start(plan.shape, arm.depths[0], unit.lr, unit.rng_seed, arm.final_depth,
                        meter=meter, width=arm.stage_widths(base)[0])
    run.curve = train.CurveLog.of(plan, corpus, (budget,))
    batches = StepBatches(corpus.train, plan.shape.block_size, plan.shape.batch_size,
                          unit.rng_seed)
    rewarm = plan.warmup_flops if "rewarm" in arm.options or (
        unit.phases and "steady" not in arm.options) else None
    _before_until(run, batches, schedule or train.schedule_of(plan), budget, grow_due=grow_due,
                  rewarm=rewarm)
    return train._row(unit, plan, corpus, run, budget)


# --- the trace ----------------------------------------------------------------------------------
@contextmanager
def _traced(monkeypatch) -> Iterator[list[tuple]]:
    """Every step's loss, its groups' rates and sizes at the optimizer step, the FLOPs spent
    (and their growth share) after its charge; every validation charge and evaluation."""
    events: list[tuple] = []
    cross_entropy, end_step, charge = (torch.nn.functional.cross_entropy,
                                       ComputeLedger.end_step, ComputeLedger.charge)

    def loss(*args, **kwargs):
        value = cross_entropy(*args, **kwargs)
        events.append(("evaluated" if kwargs.get("reduction") == "sum" else "loss",
                       float(value.detach())))
        return value

    def charged(ledger, cost):
        exhausted = end_step(ledger, cost)
        events.append(("spent", ledger.spent, ledger.flops["growth"]))
        return exhausted

    def spent(ledger, flops, kind="train"):
        charge(ledger, flops, kind)
        if kind == "validation":
            events.append(("validation", flops))

    def stepped(optimizer, args, kwargs):
        events.append(("rate", tuple(g["lr"] for g in optimizer.param_groups),
                       tuple(len(g["params"]) for g in optimizer.param_groups)))

    with monkeypatch.context() as patch:  # undone on leaving: traces never nest
        patch.setattr(train, "F", SimpleNamespace(cross_entropy=loss))
        patch.setattr(ComputeLedger, "end_step", charged)
        patch.setattr(ComputeLedger, "charge", spent)
        handle = register_optimizer_step_pre_hook(stepped)
        try:
            yield events
        finally:
            handle.remove()


CASES = {
    "branched cooldowns, curves": _plan(purpose="final", budgets=[1, 2, 3], curve_points=3),
    "phase rates re-warmed at a growth": _plan(
        arms=[{"arm": "G1-2@0.5:identity", "lr_phases": [1e-2, 3e-3]}], warmup_flops=4e6,
        curve_points=2),
    "a widening and a deepening, re-warmed": _plan(
        arms=[{"arm": "G1w8-2w16@0.5:identity+moments+rewarm", "lr": 1e-2}], budgets=[1]),
    "a widening of cloned heads and units": _plan(
        arms=[{"arm": "G1w8-2w16@0.5:identity+clone", "lr": 1e-2}], budgets=[1]),
    "long schedules, curves": _plan(budgets=[1, 2], curve_points=3, arms=[
        {"arm": "S2", "lr": 1e-2, "budgets": [1], "long_schedule": "cosine"},
        {"arm": "G1-2@0.5:identity+rewarm", "lr": 1e-2, "budgets": [1],
         "long_schedule": "linear"}]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_unit_steps_to_the_last_bit_as_the_frontiers_own_loop_did(monkeypatch, corpus,
                                                                      case):
    plan = parse_plan(CASES[case])
    for unit in plan.units():
        with _traced(monkeypatch) as now:
            rows = train.train_unit(unit, plan, corpus)
        with _traced(monkeypatch) as before:
            expected = _before_unit(unit, plan, corpus)
        assert sum(e[0] == "rate" for e in now) > 10, unit  # it trained
        first = next((i for i, (a, b) in enumerate(zip(now, before, strict=False)) if a != b),
                     None)  # where they part, if they do
        assert now == before, (unit, first, len(now), len(before))
        for row, old in zip(rows, expected, strict=True):
            assert {**row, "wall_s": None} == {**old, "wall_s": None}
