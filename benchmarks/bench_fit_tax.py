"""What Lightning and the growth callbacks cost `examples/grow_gpt.py`'s fit over a bare loop.

    python benchmarks/bench_fit_tax.py --text ../shared/data/shakespeare/shakespeare.txt
    python benchmarks/bench_fit_tax.py --text ... --gflops 480 --repeats 5   # the example's size
    python benchmarks/bench_fit_tax.py --text ... --gflops 480 --side-by-side --plain --repeats 6

Two fits of the same work, each in a fresh subprocess, alternating (``lightning, bare`` on even
repeats, ``bare, lightning`` on odd ones) so machine noise hits both alike:

* ``lightning``: the example as a user runs it (its LightningCLI with its defaults: a
  `MorphogenesisCallback` whose `StackController` grows ``self.blocks`` from 1 to 4 with the
  ``identity`` operator at its ``tau``, `ComputeBudget` metering every step, scheduling the
  learning rate and ending the fit, the example's TensorBoard logger and validation cadence),
  with the progress bar off unless ``--progress-bar``;
* ``bare``: plain PyTorch over the model, data module and cadence the same CLI builds (so the
  same `TinyGPT` init, the same batches, the sampler re-seeded per epoch as the Trainer does),
  the example's logging done the way a hand-written loop does it (the training loss to a
  TensorBoard ``SummaryWriter`` every ``log_every_n_steps`` steps, the validation loss and
  accuracy after each validation: what the example's module logs, at the Trainer's cadence),
  the same AdamW and weight-decay groups, the budget's own LR schedule at the middle of each
  step's share of the budget, the same number of steps, the same growth at the same step done by
  hand (`core.depth.grow` with the controller's operator: new blocks in the AdamW groups of
  their sources), and a validation pass wherever the Trainer runs one (every
  ``val_check_interval`` steps, or each epoch's end, and after the last step).

The bare loop takes its step count and growth step from the first Lightning fit: the steps are
the Trainer's ``global_step``; the growth step solves ``n1 c1 + n4 c4 = spent``,
``n1 + n4 = steps`` with the one- and four-block step costs ``c1``, ``c4`` from the FLOP meter
(metered before its timer starts). Each fit's time is the ``Trainer.fit`` call's (the example's
own ``wall time``, the CLI built as its ``fit`` builds it) or the bare loop's from building its
optimizer to its last validation; module imports and the CLI's parsing are outside both. Both
children set ``torch.set_num_threads`` (and ``OMP_NUM_THREADS``) to ``--threads``. The bare
loop's final validation loss equals the Lightning fit's (printed beside each fit): the same work.

``--plain`` adds a third fit, a plain `lightning.Trainer` over the same work with one small
callback growing the model and setting the learning rate by hand, the two growth callbacks
absent: ``plain / bare`` is Lightning's own share of the tax, ``lightning / plain`` the
callbacks'.

``--side-by-side`` runs each pair at once instead, the Lightning fit (or the plain Trainer's)
on one CPU and the bare loop on the other (pinned, swapped every repeat), after one Lightning fit
alone that plans the steps. A shared host's speed drifts by 10-30 % between fits a minute apart,
which one-after-the-other pairs take as noise; two fits that run at the same time meet the same
drift.

Prints every fit, then the median ratio ``lightning / bare`` over the repeats (each repeat's
pair) and its range, by wall time and by the process's CPU time (`time.process_time`, which a
machine shared with other jobs disturbs far less than the wall clock; with one torch thread it is
the fit's own work).

Short by default (a budget of 96 GFLOP, a fifth of the example's: about 350 steps, grown after
~175), so the fit's fixed costs (the sanity check, the meter's first pass per shape, the
timeline image at the end) weigh more than in the example's 480 GFLOP fit; pass ``--gflops 480``
for the example's own length.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "grow_gpt.py"
GFLOP = 1e9
#: The example's shapes, for the step costs (everything else is read from its CLI).
BLOCK_SIZE, BATCH_SIZE, SEED, GROW_BLOCKS = 32, 32, 0, 3
KINDS = ("lightning", "bare")
#: What each fit is timed by: wall time, and the process's CPU time (less shared-noise).
CLOCKS = ("seconds", "cpu")


def load_example() -> ModuleType:
    """`examples/grow_gpt.py` as a module (it is a script, not a package member)."""
    spec = importlib.util.spec_from_file_location("grow_gpt", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["grow_gpt"] = module
    spec.loader.exec_module(module)
    return module


def example_cli(gpt: ModuleType, args: argparse.Namespace, logdir: str) -> Any:
    """The example's LightningCLI, built as its ``fit`` builds it (model, data and Trainer
    instantiated, the seed set, nothing run): every fit here takes its model, data and cadence
    from it, so the three fits follow the example's defaults as they change."""
    import logging

    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    argv = ["--text", args.text, "--gflops", str(args.gflops), "--logdir", logdir,
            "--trainer.enable_progress_bar", str(args.progress_bar).lower()]
    return gpt.GrowCLI(gpt.TinyGPT, gpt.TextDataModule, run=False, args=argv,
                       seed_everything_default=SEED, save_config_kwargs={"overwrite": True})


def growth_and_budget(cli: Any) -> tuple[Any, Any, str]:
    """The example's growth (``--grow`` blocks on ``self.blocks``), its `ComputeBudget` (the
    budget and LR schedule) and its controller's growth operator."""
    from esper_lightning.core.depth import DepthGrowth

    callbacks = cli.trainer.callbacks
    morpho = next(c for c in callbacks if type(c).__name__ == "MorphogenesisCallback")
    budget = next(c for c in callbacks if type(c).__name__ == "ComputeBudget")
    return DepthGrowth("blocks", blocks=GROW_BLOCKS), budget, str(morpho.controller.operator)


def run_lightning(args: argparse.Namespace) -> dict[str, Any]:
    """One fit of the example as a user runs it; its seconds, steps and FLOPs."""
    gpt = load_example()
    with tempfile.TemporaryDirectory() as logdir:
        cli = example_cli(gpt, args, logdir)
        start, cpu = time.perf_counter(), time.process_time()
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)  # what the example's fit() times
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        budget = next(c for c in cli.trainer.callbacks if isinstance(c, gpt.ComputeBudget))
        val_loss = float(cli.trainer.callback_metrics["val_loss"])
        steps = int(cli.trainer.global_step)
    return {"seconds": seconds, "cpu": cpu, "steps": steps, "spent": budget.spent,
            "val_loss": val_loss}


def step_costs(gpt: ModuleType) -> tuple[int, int]:
    """Training FLOPs of a step of the one-block model and of the grown four-block one."""
    import torch

    from esper_lightning.core.flops import FlopMeter

    x = torch.zeros(BATCH_SIZE, BLOCK_SIZE, dtype=torch.long)
    meter = FlopMeter()
    small = gpt.TinyGPT(n_layer=1, block_size=BLOCK_SIZE)
    big = gpt.TinyGPT(n_layer=1 + GROW_BLOCKS, block_size=BLOCK_SIZE)
    return meter.training_step(small, x), meter.training_step(big, x)


def growth_step(steps: int, spent: float, small: int, big: int) -> int:
    """Steps the Lightning fit took before it grew, from what it spent (module docstring)."""
    n1 = (big * steps - spent) / (big - small)
    if abs(n1 - round(n1)) > 1e-6 or not 0 <= n1 <= steps:
        raise SystemExit(f"the Lightning fit's {steps} steps and {spent:.0f} FLOPs are not one "
                         f"growth from {small} to {big} FLOPs a step (n1 = {n1})")
    return round(n1)


def validates_after(trainer: Any, step: int, epoch_end: bool, last: bool) -> bool:
    """Whether the Trainer validates after training step ``step`` (1-based, counted over the
    fit): every ``val_check_interval`` steps when ``check_val_every_n_epoch`` is None, else at
    each epoch's end (the example's cadences), and after the step that stops the fit."""
    if last:
        return True
    if trainer.check_val_every_n_epoch is None:
        return step % int(trainer.val_check_interval) == 0
    return epoch_end


def set_epoch(loader: Any, epoch: int) -> None:
    """What the Trainer does to a loader each epoch: re-seed its sampler's shuffle."""
    for sampler in (getattr(loader, "sampler", None),
                    getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)


def run_bare(args: argparse.Namespace) -> dict[str, Any]:
    """The same work in plain PyTorch (module docstring); its seconds and what it spent."""
    import torch

    from esper_lightning.core.depth import grow
    from esper_lightning.schedule import batch_fraction

    gpt = load_example()
    small_cost, big_cost = step_costs(gpt)  # outside the timer: the schedule's input only
    with tempfile.TemporaryDirectory() as logdir:
        cli = example_cli(gpt, args, logdir)  # the model, data and cadence; its Trainer unused
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    growth, budget, operator = growth_and_budget(cli)

    start, cpu = time.perf_counter(), time.process_time()
    optimizer = model.configure_optimizers()
    base = [group["lr"] for group in optimizer.param_groups]
    train, val = data.train_dataloader(), data.val_dataloader()

    from torch.utils.tensorboard import SummaryWriter

    logdir = tempfile.mkdtemp()
    writer = SummaryWriter(logdir)  # what the example logs, as a hand-written loop logs it
    every = trainer.log_every_n_steps

    def validate(step: int) -> float:
        model.eval()
        total, hits, count = 0.0, 0.0, 0
        with torch.inference_mode():
            for batch in val:
                loss, accuracy = model._loss(batch)  # loss and accuracy, as validation_step
                total += float(loss) * len(batch[0])
                hits += float(accuracy) * len(batch[0])
                count += len(batch[0])
        model.train()
        writer.add_scalar("val_loss", total / count, step)
        writer.add_scalar("val_acc", hits / count, step)
        return total / count

    spent, step, epoch, val_loss = 0.0, 0, 0, float("nan")
    cost = small_cost
    while step < args.steps:
        set_epoch(train, epoch)
        batches = len(train)
        for index, batch in enumerate(train):
            if step == args.grow_at:
                grow(model, growth, operator, optimizer)
                cost = big_cost
            multiplier = budget.schedule.multiplier(batch_fraction(spent, cost,
                                                                   budget.budget_flops))
            for group, lr in zip(optimizer.param_groups, base, strict=True):
                group["lr"] = lr * multiplier
            optimizer.zero_grad(set_to_none=True)
            loss, _ = model._loss(batch)
            loss.backward()
            optimizer.step()
            spent += cost
            step += 1
            last = step == args.steps
            if step % every == 0 or last:
                writer.add_scalar("train_loss", float(loss), step)
            if validates_after(trainer, step, index + 1 == batches, last):
                val_loss = validate(step)
            if last:
                break
        epoch += 1
    writer.close()  # the Trainer's loggers finalize inside its fit, too
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    shutil.rmtree(logdir, ignore_errors=True)
    return {"seconds": seconds, "cpu": cpu, "steps": step, "spent": spent, "val_loss": val_loss,
            "grow_at": args.grow_at}


def run_plain(args: argparse.Namespace) -> dict[str, Any]:
    """The same work in a plain `lightning.Trainer` without the two callbacks: the growth and
    the schedule done by one small callback by hand, as the bare loop does them (``--plain``);
    its distance to ``bare`` is Lightning's share of the tax, its distance to ``lightning`` the
    growth callbacks'."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    from esper_lightning.core.depth import grow
    from esper_lightning.schedule import apply_multiplier, batch_fraction, set_base_lrs

    gpt = load_example()
    small_cost, big_cost = step_costs(gpt)

    with tempfile.TemporaryDirectory() as logdir:
        cli = example_cli(gpt, args, logdir)
        growth, budget, operator = growth_and_budget(cli)
        example = cli.trainer

        class ByHand(L.Callback):
            """Grow at ``--grow-at``, set the WSD learning rate, stop after ``--steps``."""

            def __init__(self) -> None:
                self.spent, self.cost = 0.0, small_cost

            def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
                set_base_lrs(trainer.optimizers[0].param_groups)

            def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                     batch: Any, batch_idx: int) -> None:
                optimizer = trainer.optimizers[0]
                if trainer.global_step == args.grow_at:
                    grow(pl_module, growth, operator, optimizer)
                    self.cost = big_cost
                fraction = batch_fraction(self.spent, self.cost, budget.budget_flops)
                apply_multiplier(optimizer.param_groups, budget.schedule.multiplier(fraction))

            def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                   outputs: Any, batch: Any, batch_idx: int) -> None:
                self.spent += self.cost
                if trainer.global_step >= args.steps:
                    trainer.should_stop = True  # as ComputeBudget stops: validation still runs

        by_hand = ByHand()
        trainer = L.Trainer(
            max_epochs=-1, callbacks=[by_hand], accelerator="cpu", devices=1,
            logger=TensorBoardLogger(logdir, name="plain", default_hp_metric=False),
            log_every_n_steps=example.log_every_n_steps,
            val_check_interval=example.val_check_interval,
            check_val_every_n_epoch=example.check_val_every_n_epoch,
            enable_checkpointing=False, enable_model_summary=False,
            enable_progress_bar=args.progress_bar)
        start, cpu = time.perf_counter(), time.process_time()
        trainer.fit(cli.model, datamodule=cli.datamodule)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu": cpu, "steps": int(trainer.global_step),
            "spent": by_hand.spent, "val_loss": float(trainer.callback_metrics["val_loss"])}


def child_command(kind: str, args: argparse.Namespace, extra: list[str],
                  cpu: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one fit in a fresh interpreter (on CPU ``cpu`` only,
    when given)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, __file__, "--child", kind, "--text", args.text,
           "--gflops", str(args.gflops), "--threads", str(args.threads), *extra]
    if args.progress_bar:
        cmd.append("--progress-bar")
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    return cmd, env


def result_of(kind: str, returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    if returncode != 0:
        raise SystemExit(f"{kind} fit failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def child(kind: str, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """Run one fit in a fresh interpreter; its JSON result line."""
    cmd, env = child_command(kind, args, extra)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    return result_of(kind, done.returncode, done.stdout, done.stderr)


def side_by_side(kinds: tuple[str, str], args: argparse.Namespace, plan: list[str],
                 cpus: tuple[int, int]) -> dict[str, dict[str, Any]]:
    """Two fits at once, each alone on its own CPU: a drift of the machine's speed (a shared
    host's) reaches both alike, which fits one after the other do not share."""
    running = {}
    for kind, cpu in zip(kinds, cpus, strict=True):
        cmd, env = child_command(kind, args, plan if kind != "lightning" else [], cpu)
        running[kind] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
    results = {}
    for kind, process in running.items():
        stdout, stderr = process.communicate()
        results[kind] = result_of(kind, process.returncode, stdout, stderr)
    return results


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default=str(ROOT.parent / "shared/data/shakespeare/"
                                              "shakespeare.txt"), help="the example's text file")
    parser.add_argument("--gflops", type=float, default=96.0,
                        help="the budget (the example's default: 480)")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of fits")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each fit")
    parser.add_argument("--progress-bar", action="store_true",
                        help="run the Lightning fit with the example's progress bar")
    parser.add_argument("--plain", action="store_true",
                        help="also time a plain Trainer doing the growth and schedule by hand "
                             "(splits the tax into Lightning's and the callbacks')")
    parser.add_argument("--side-by-side", action="store_true",
                        help="run each pair of fits at once, one on each of two CPUs (swapped "
                             "every repeat), after one Lightning fit alone that plans the steps")
    parser.add_argument("--child", choices=["lightning", "bare", "plain"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--grow-at", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child is not None:
        if args.cpu is not None:
            os.sched_setaffinity(0, {args.cpu})
        import torch

        torch.set_num_threads(args.threads)
        run = {"lightning": run_lightning, "bare": run_bare, "plain": run_plain}[args.child]
        result = run(args)
        print(json.dumps(result))
        return

    import lightning
    import torch

    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}; torch {torch.__version__}, lightning "
          f"{lightning.__version__}, {args.threads} torch thread(s); budget {args.gflops:g} "
          f"GFLOP, progress bar {'on' if args.progress_bar else 'off'}")
    kinds = (*KINDS, "plain") if args.plain else KINDS
    times: dict[tuple[str, str], list[float]] = {(k, c): [] for k in kinds for c in CLOCKS}
    ratios: dict[tuple[str, str], list[float]] = {(k, c): [] for k in kinds[::2] for c in CLOCKS}
    if args.side_by_side:
        if len(os.sched_getaffinity(0)) < 2:
            raise SystemExit("--side-by-side needs 2 CPUs; this process may use "
                             f"{len(os.sched_getaffinity(0))}")
        run_side_by_side(args, kinds, times, ratios)
    else:
        run_in_turn(args, kinds, times, ratios)
    report(kinds, times, ratios)


def print_fit(repeat: int | str, kind: str, result: dict[str, Any]) -> None:
    print(f"repeat {repeat}: {kind:<11} wall {result['seconds']:7.2f} s  cpu "
          f"{result['cpu']:7.2f} s  steps {result['steps']}  val_loss "
          f"{result['val_loss']:.6f}", flush=True)


def plan_from(result: dict[str, Any]) -> list[str]:
    """The bare loop's (and the plain Trainer's) steps and growth step, from a Lightning fit."""
    small, big = step_costs(load_example())
    grow_at = growth_step(result["steps"], result["spent"], small, big)
    print(f"the Lightning fit: {result['steps']} steps, grown after step {grow_at}")
    return ["--steps", str(result["steps"]), "--grow-at", str(grow_at)]


def run_side_by_side(args: argparse.Namespace, kinds: tuple[str, ...],
                     times: dict[tuple[str, str], list[float]],
                     ratios: dict[tuple[str, str], list[float]]) -> None:
    """A Lightning fit alone plans the steps (not counted); then each repeat runs ``lightning``
    beside ``bare`` (and ``plain`` beside another ``bare``), on CPUs 0 and 1, swapped every
    repeat."""
    first = child("lightning", args, [])
    print_fit("plan", "lightning", first)
    plan = plan_from(first)
    for repeat in range(args.repeats):
        cpus = (0, 1) if repeat % 2 == 0 else (1, 0)
        for kind in kinds[::2]:
            pair = side_by_side((kind, "bare"), args, plan, cpus)
            for name, result in pair.items():
                print_fit(repeat, f"{name}@{cpus[0] if name == kind else cpus[1]}", result)
                for clock in CLOCKS:
                    times[name, clock].append(result[clock])
            for clock in CLOCKS:
                ratios[kind, clock].append(pair[kind][clock] / pair["bare"][clock])


def run_in_turn(args: argparse.Namespace, kinds: tuple[str, ...],
                times: dict[tuple[str, str], list[float]],
                ratios: dict[tuple[str, str], list[float]]) -> None:
    """One fit after the other, the order alternating every repeat; the first fit is Lightning's
    and plans the others' steps."""
    plan: list[str] | None = None
    for repeat in range(args.repeats):
        order = kinds if repeat % 2 == 0 else (kinds[0], *kinds[1:][::-1])[::-1]
        pair: dict[str, dict[str, Any]] = {}
        for kind in order:
            assert kind == "lightning" or plan is not None  # the first fit is Lightning's
            result = child(kind, args, plan if kind != "lightning" and plan is not None else [])
            if kind == "lightning" and plan is None:
                plan = plan_from(result)
            pair[kind] = result
            for clock in CLOCKS:
                times[kind, clock].append(result[clock])
            print_fit(repeat, kind, result)
        for kind, clock in ratios:
            ratios[kind, clock].append(pair[kind][clock] / pair["bare"][clock])


def report(kinds: tuple[str, ...], times: dict[tuple[str, str], list[float]],
           ratios: dict[tuple[str, str], list[float]]) -> None:
    for clock, name in zip(CLOCKS, ("wall", "cpu"), strict=True):
        line = [f"{name:>4}:"]
        for kind in kinds:
            t = times[kind, clock]
            line.append(f"{kind} median {statistics.median(t):.2f} s ({min(t):.2f}-{max(t):.2f})")
        print("  ".join(line))
        for kind in kinds[::2]:
            r = ratios[kind, clock]
            print(f"{name:>4}: ratio {kind} / bare median {statistics.median(r):.3f} "
                  f"(range {min(r):.3f}-{max(r):.3f}, {len(r)} repeats)")
    print(f"load average now {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()
