"""Fit time with `MorphogenesisCallback` over fit time without it, measured side by side.

    python benchmarks/bench_callback_overhead.py --data-dir ../shared/data/cifar10-subset
    python benchmarks/bench_callback_overhead.py --accelerator gpu  # a generated fixture

Three configurations of the baseline host train for the same epochs on the same data, in
interleaved repeats so machine noise hits them alike:

* ``plain``: a `lightning.Trainer` with no callback;
* ``callback``: `MorphogenesisCallback` with a controller that never acts (no seed);
* ``seed``: the callback with one conv_light seed germinated in ``r0c1`` and blending from the
  first epoch (one extra fused validation forward per batch, the seed in every training step).

Prints the median wall time of each and the ratios to ``plain`` (target: callback <= 1.03).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import lightning as L
import torch

from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import ScriptedController, StaticController
from esper_lightning.core.actions import Action, AlphaSpeed, LifecycleOp, Tempo
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.data import CIFAR10DataModule, write_cifar10_fixture
from esper_lightning.hosts import CifarCNNHost

CONFIGS = ("plain", "callback", "seed")


def seed_script() -> ScriptedController:
    """Germinate before the first epoch's training ends, blend from epoch 1 on."""
    return ScriptedController({
        0: Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light",
                  tempo=Tempo.FAST),
        1: Action(LifecycleOp.ADVANCE, 0),
        2: Action(LifecycleOp.ADVANCE, 0),
        3: Action(LifecycleOp.SET_ALPHA_TARGET, 0, alpha_speed=AlphaSpeed.INSTANT),
    })


def fit_seconds(config: str, data_dir: str, epochs: int, batch_size: int,
                accelerator: str) -> float:
    torch.manual_seed(0)
    callbacks = []
    if config == "callback":
        callbacks = [MorphogenesisCallback(StaticController(), slots=["r0c1"])]
    elif config == "seed":
        gates = GateConfig(min_training_epochs=0)
        callbacks = [MorphogenesisCallback(seed_script(), slots=["r0c1"], gate_config=gates)]
    trainer = L.Trainer(
        max_epochs=epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        accelerator=accelerator, devices=1,
    )
    datamodule = CIFAR10DataModule(data_dir, batch_size=batch_size)
    start = time.perf_counter()
    trainer.fit(CifarCNNHost("baseline", slots=["r0c1"]), datamodule=datamodule)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None,
                        help="CIFAR-10 folder (default: a generated 2,000-image fixture)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    args = parser.parse_args()
    if args.accelerator == "gpu" and not torch.cuda.is_available():
        parser.error("--accelerator gpu: this machine has no CUDA device; accepted here: cpu")
    data_dir = args.data_dir or str(write_cifar10_fixture("/tmp/esper_bench_fixture", 2000, 500))
    fit_seconds("plain", data_dir, 1, args.batch_size, args.accelerator)  # warm-up: imports
    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for _ in range(args.repeats):
        for config in CONFIGS:
            times[config].append(fit_seconds(config, data_dir, args.epochs, args.batch_size,
                                             args.accelerator))
    median = {c: statistics.median(t) for c, t in times.items()}
    gpu = f", {torch.cuda.get_device_name(0)}" if args.accelerator == "gpu" else ""
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs{gpu}, "
          f"torch {torch.__version__}, lightning {L.__version__}, threads "
          f"{torch.get_num_threads()}")
    print(f"data: {data_dir}, {args.epochs} epochs x {args.repeats} repeats, "
          f"batch {args.batch_size}")
    for config in CONFIGS:
        spread = f"{min(times[config]):.2f}-{max(times[config]):.2f}"
        print(f"{config:>9}: median {median[config]:.2f} s (range {spread} s), "
              f"ratio {median[config] / median['plain']:.3f}")


if __name__ == "__main__":
    main()
