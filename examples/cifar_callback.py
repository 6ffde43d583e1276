"""Grow seeds in a CIFAR-10 CNN with a plain `lightning.Trainer`.

    python examples/cifar_callback.py --data-dir ../shared/data/cifar10-subset --epochs 30 \
        --logdir runs/callback
    tensorboard --logdir runs/callback

The baseline host trains with a `HeuristicController` (or a static / random baseline) deciding
once per epoch, a `GovernorCallback` watching for divergence, TensorBoard logs under --logdir, and
a summary table at the end.

Timing: the upstream constants (3 plateau epochs, a 3-epoch stability latch, 10 epochs of
incubation before blending) are tuned for 150-epoch runs on full CIFAR-10; on the 846-image
validation split of a subset the accuracy is too noisy to show 3 flat epochs in a row. By
default this demo therefore germinates after 1 flat epoch once the host is stable for 1 epoch
and incubates 5 epochs; ``--upstream-timing`` restores the upstream values.
"""

from __future__ import annotations

import argparse
import sys
import time

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from esper_lightning.callbacks import GovernorCallback, MorphogenesisCallback
from esper_lightning.controllers import (
    HeuristicConfig,
    HeuristicController,
    RandomController,
    StaticController,
)
from esper_lightning.controllers.base import Controller
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.data import CIFAR10DataModule, DataError
from esper_lightning.hosts import PRESETS, CifarCNNHost

DEMO_HEURISTIC = HeuristicConfig(plateau_epochs_to_germinate=1, stabilization_epochs=1)
DEMO_GATES = GateConfig(min_training_epochs=5)
CONTROLLERS = ("heuristic", "random", "static")


def make_controller(name: str, rng_seed: int, upstream_timing: bool) -> Controller:
    if name == "heuristic":
        return HeuristicController(None if upstream_timing else DEMO_HEURISTIC)
    return RandomController(rng_seed=rng_seed) if name == "random" else StaticController()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="folder with cifar-10-batches-py/")
    parser.add_argument("--download", action="store_true", help="download CIFAR-10 if missing")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--slots", nargs="+", default=["r0c0", "r0c1", "r0c2"])
    parser.add_argument("--controller", choices=CONTROLLERS, default="heuristic")
    parser.add_argument("--upstream-timing", action="store_true",
                        help="upstream plateau/stability/incubation constants (long runs)")
    parser.add_argument("--host-preset", choices=sorted(PRESETS), default="baseline")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--logdir", default="runs/callback")
    parser.add_argument("--rng-seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    return args


def summary(engine: MorphogenesisEngine, val_acc: float, seconds: float) -> str:
    rows = [
        ("validation accuracy", f"{val_acc:.2f}%"),
        ("host parameters", f"{engine.host_params:,}"),
        ("seed parameters", f"{engine.seed_params:,}"),
        ("seeds germinated", str(engine.count("germinated"))),
        ("seeds fossilized", str(engine.count("fossilized"))),
        ("seeds pruned", str(engine.count("pruned"))),
        ("wall time", f"{seconds:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append("")
    lines.append(f"{'epoch':>5}  {'slot':<6} {'event':<11} {'blueprint':<11} reason")
    for e in engine.events:
        lines.append(f"{e.epoch:>5}  {e.slot_id:<6} {e.kind:<11} {e.blueprint:<11} {e.reason}")
    for slot_id, slot in engine.slots.items():
        if slot.state is not None:
            lines.append(f"  now: {slot_id} {slot.state.blueprint} {slot.stage.name} "
                         f"alpha={slot.alpha:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    L.seed_everything(args.rng_seed, verbose=False)
    try:
        host = CifarCNNHost(args.host_preset, slots=args.slots)
        datamodule = CIFAR10DataModule(
            args.data_dir, download=args.download, batch_size=args.batch_size,
            rng_seed=args.rng_seed,
        )
        datamodule.prepare_data()
        datamodule.setup("fit")
    except (ValueError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    controller = make_controller(args.controller, args.rng_seed, args.upstream_timing)
    gates = None if args.upstream_timing else DEMO_GATES
    morpho = MorphogenesisCallback(controller, gate_config=gates)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        callbacks=[GovernorCallback(num_classes=10), morpho],
        logger=TensorBoardLogger(args.logdir, name=args.controller),
        enable_checkpointing=False,
        enable_progress_bar=not args.no_progress,
        log_every_n_steps=10,
    )
    start = time.perf_counter()
    trainer.fit(host, datamodule=datamodule)
    val_acc = 100.0 * float(trainer.callback_metrics["val_acc"])
    assert morpho.engine is not None
    print(summary(morpho.engine, val_acc, time.perf_counter() - start))
    print(f"TensorBoard: tensorboard --logdir {args.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
