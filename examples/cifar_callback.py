"""Grow seeds in a CIFAR-10 CNN with a plain `lightning.Trainer`, configured by `LightningCLI`.

    python examples/cifar_callback.py --data-dir ../shared/data/cifar10-subset --epochs 30 \
        --logdir runs/callback --timeline runs/callback/timeline.png
    tensorboard --logdir runs/callback

The baseline host trains with a `HeuristicController` deciding once per epoch, a
`GovernorCallback` watching for divergence, TensorBoard logs under --logdir
(``runs/callback/version_N``: ``morpho/*`` scalars grouped per slot in the Custom Scalars tab,
the seed timeline in the Images tab), one log line per lifecycle event and a summary table at
the end.

Everything is a LightningCLI option (``--help`` lists them all, ``--print_config`` writes a YAML
file that ``--config`` reads back): the host (``--model.*``), the data (``--data.*``), the
Trainer (``--trainer.*``), the growth callback (``--morpho.*``, its controller included) and the
governor (``--governor.*``). A few everyday ones have short flags: ``--data-dir``, ``--epochs``,
``--logdir`` and ``--timeline``. For example::

    --morpho.controller esper_lightning.controllers.RandomController   # a baseline controller
    --morpho.controller.config.reference_epochs null      # the heuristic's fixed research timing
    --morpho.gate_config.min_training_epochs 10           # G2's default incubation
    --model.preset scale --data.batch_size 256 --seed_everything 1

Timing: the heuristic's epoch-counted knobs are given for a 50-epoch run and scale with
``--epochs`` (30 epochs: a plateau of 2 epochs after epoch 3 at the earliest); this example also
shortens G2's incubation from 10 to 5 epochs so that seeds blend in well before the end.
"""

from __future__ import annotations

import logging
import sys
import time
from argparse import ArgumentError
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger

from esper_lightning.callbacks import GovernorCallback, MorphogenesisCallback
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.data import CIFAR10DataModule, DataError
from esper_lightning.errors import ConfigError
from esper_lightning.hosts import CifarCNNHost
from esper_lightning.viz import save_timeline


class GrowthCLI(LightningCLI):
    """LightningCLI with the governor and the growth callback as configurable sections."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--data-dir", default=None,
                            help="folder with cifar-10-batches-py/ (default: $ESPER_DATA_DIR)")
        parser.add_argument("--epochs", type=int, default=30, help="epochs to train")
        parser.add_argument("--logdir", default="runs/callback",
                            help="TensorBoard folder (unless --trainer.logger is given)")
        parser.add_argument("--timeline", default=None,
                            help="also save the seed timeline image here (e.g. timeline.png)")
        parser.link_arguments("data_dir", "data.data_dir")
        parser.link_arguments("epochs", "trainer.max_epochs")
        parser.link_arguments("seed_everything", "data.rng_seed")
        parser.add_lightning_class_args(GovernorCallback, "governor")  # listed first: it acts
        parser.add_lightning_class_args(MorphogenesisCallback, "morpho")  # before the decision
        parser.set_defaults({
            "model.slots": ["r0c0", "r0c1", "r0c2"],
            "governor.num_classes": 10,
            "morpho.controller": {"class_path": "esper_lightning.controllers.HeuristicController"},
            "morpho.gate_config": {"min_training_epochs": 5},
            "trainer.log_every_n_steps": 10,
        })

    def before_instantiate_classes(self) -> None:
        if not self.config["epochs"] >= 1:  # 0 trains nothing; Lightning reads -1 as endless
            raise ConfigError(f"--epochs must be an int >= 1, got {self.config['epochs']}")

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        # Read the data first: a bad input fails before the Trainer and its logger exist (the
        # fit reuses what was read).
        self.datamodule.prepare_data()
        self.datamodule.setup("fit")
        if self.config.get("trainer", {}).get("logger") is None:  # the default: TensorBoard
            kwargs["logger"] = TensorBoardLogger(self.config["logdir"], name="",
                                                 default_hp_metric=False)
        return super().instantiate_trainer(**kwargs)


def summary(engine: MorphogenesisEngine, val_acc: float | None, seconds: float) -> str:
    counts = engine.event_counts()
    rows = [
        ("validation accuracy", f"{val_acc:.2f}%" if val_acc is not None
                                else "none: the fit ended before its first validation"),
        ("host parameters", f"{engine.host_params:,}"),
        ("seed parameters", f"{engine.seed_params:,}"),
        ("seeds germinated", str(counts["germinated"])),
        ("seeds fossilized", str(counts["fossilized"])),
        ("seeds pruned", str(counts["pruned"])),
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


def show_lifecycle_events() -> None:
    """Print the library's INFO lines (one per germination, fossilization or prune)."""
    logger = logging.getLogger("esper_lightning")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[esper] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # The seed is in the run's config.yaml: an error is then the only line a bad input prints.
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    show_lifecycle_events()
    try:
        cli = GrowthCLI(
            CifarCNNHost, CIFAR10DataModule, run=False, args=argv, seed_everything_default=0,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"exit_on_error": False},  # the error alone, not the usage
        )
        morpho = next(c for c in cli.trainer.callbacks if isinstance(c, MorphogenesisCallback))
        start = time.perf_counter()
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    except (ConfigError, DataError, ArgumentError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    assert morpho.engine is not None
    accuracy = cli.trainer.callback_metrics.get("val_acc")
    val_acc = None if accuracy is None else 100.0 * float(accuracy)
    print(summary(morpho.engine, val_acc, time.perf_counter() - start))
    if cli.config["timeline"]:
        save_timeline(morpho.engine.timeline, cli.config["timeline"],
                      slot_ids=morpho.engine.slot_ids, title="seed timeline (CifarCNNHost)")
        print(f"timeline: {cli.config['timeline']}")
    print(f"TensorBoard: tensorboard --logdir {cli.config['logdir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
