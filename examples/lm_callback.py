"""Grow seeds in a small byte-level GPT with a plain `lightning.Trainer` and `LightningCLI`.

    python examples/lm_callback.py --text ../shared/data/shakespeare/shakespeare.txt
    tensorboard --logdir runs/lm_callback

The ``tiny`` `GPTHost` (2 blocks, width 64, a slot after each block) learns to predict the next
byte of the text while a `HeuristicController` decides once per epoch whether to germinate a
transformer seed, advance, fossilize or prune it, and a `GovernorCallback` (vocabulary 256 for
its lobotomy rule) watches for divergence. Nothing in the growth code is specific to language
models: the callback reads ``(x, y)`` batches whose targets are ``[B, T]`` next tokens, so its
counterfactual measurement counts every token, and its contribution is next-token accuracy.

TensorBoard gets ``val_loss`` (mean per token), ``val_ppl`` (its exponential), ``val_acc``
(next-token accuracy), the ``morpho/*`` scalars (grouped per slot in the Custom Scalars tab) and
the seed timeline (Images tab) under ``--logdir`` (``runs/lm_callback/version_N``). One line is
printed per lifecycle event and a summary at the end.

Everything is a LightningCLI option (``--help`` lists them all, ``--print_config`` writes a YAML
file that ``--config`` reads back): the host (``--model.*``), the text (``--data.*``), the Trainer
(``--trainer.*``), the growth callback (``--morpho.*``, its controller included) and the governor
(``--governor.*``). The everyday ones have short flags: ``--text`` (a text file, or a folder
holding one), ``--epochs``, ``--logdir`` and ``--timeline``. For example::

    --data.block_size 32 --data.train_blocks 640 --model.lr 3e-4 --seed_everything 1
    --morpho.gate_config.min_training_epochs 10           # G2's default incubation

Sizes (about 1.5 minutes on a busy 2-core CPU): 20 epochs of 1,280 random 64-byte blocks (40
steps of 32 blocks), validation on the first 256 blocks (16,384 bytes) of the held-out tail. The
heuristic's timing knobs scale with ``--epochs`` (`HeuristicConfig.reference_epochs`), and G2's
incubation is shortened to 2 epochs, so a seed germinated around epoch 4 blends in and is judged
before the end.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from argparse import ArgumentError
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger

from esper_lightning.callbacks import GovernorCallback, MorphogenesisCallback
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.data import ByteTokenizer, DataError, TextDataModule, find_text_file
from esper_lightning.errors import ConfigError
from esper_lightning.hosts import GPTHost
from esper_lightning.viz import save_timeline


class GrowthCLI(LightningCLI):
    """LightningCLI with the governor and the growth callback as configurable sections."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--text", default=None,
                            help="a text file, or a folder holding one (TinyStories-valid.txt "
                            "or a single *.txt file)")
        parser.add_argument("--epochs", type=int, default=20, help="epochs to train")
        parser.add_argument("--logdir", default="runs/lm_callback",
                            help="TensorBoard folder (unless --trainer.logger is given)")
        parser.add_argument("--timeline", default=None,
                            help="also save the seed timeline image here (e.g. timeline.png)")
        parser.link_arguments("text", "data.path")
        parser.link_arguments("epochs", "trainer.max_epochs")
        parser.link_arguments("seed_everything", "data.rng_seed")
        parser.add_lightning_class_args(GovernorCallback, "governor")  # listed first: it acts
        parser.add_lightning_class_args(MorphogenesisCallback, "morpho")  # before the decision
        parser.set_defaults({
            "model.preset": "tiny", "model.lr": 1e-3,
            "data.block_size": 64, "data.batch_size": 32, "data.train_blocks": 1280,
            "data.val_blocks": 256,
            "governor.num_classes": ByteTokenizer.vocab_size,
            "morpho.controller": {"class_path": "esper_lightning.controllers.HeuristicController"},
            "morpho.topology": "transformer",
            "morpho.gate_config": {"min_training_epochs": 2},
            "trainer.accelerator": "cpu", "trainer.devices": 1, "trainer.log_every_n_steps": 10,
            "trainer.enable_model_summary": False, "trainer.enable_checkpointing": False,
        })

    def before_instantiate_classes(self) -> None:
        """``--text`` may name a folder: the data module reads the file it holds."""
        if self.config["text"] is not None:
            self.config["data"]["path"] = str(find_text_file(self.config["text"],
                                                             downloadable=False))
        elif not self.config["data"]["download"]:
            raise ConfigError("no text to learn: pass --text FILE (a text file or a folder "
                              "holding one) or --data.download true (TinyStories)")

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        # Read the data first: a bad input fails before the Trainer and its logger exist (the
        # fit reuses what was read).
        self.datamodule.prepare_data()
        self.datamodule.setup("fit")
        if self.config.get("trainer", {}).get("logger") is None:  # the default: TensorBoard
            kwargs["logger"] = TensorBoardLogger(self.config["logdir"], name="",
                                                 default_hp_metric=False)
        return super().instantiate_trainer(**kwargs)


def summary(engine: MorphogenesisEngine, val_loss: float | None, val_acc: float | None,
            seconds: float) -> str:
    counts = engine.event_counts()
    rows = [
        *([("validation loss", f"{val_loss:.4f} per token"),
           ("validation perplexity", f"{math.exp(val_loss):.3f}"),
           ("next-token accuracy", f"{val_acc:.2f}%")]
          if val_loss is not None and val_acc is not None
          else [("validation", "none: the fit ended before its first validation")]),
        ("host parameters", f"{engine.host_params:,}"),
        ("seed parameters", f"{engine.seed_params:,}"),
        ("seeds germinated", str(counts["germinated"])),
        ("seeds fossilized", str(counts["fossilized"])),
        ("seeds pruned", str(counts["pruned"])),
        ("wall time", f"{seconds:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += ["", f"{'epoch':>5}  {'slot':<6} {'event':<11} {'blueprint':<11} reason"]
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
        cli = GrowthCLI(GPTHost, TextDataModule, run=False, args=argv,
                        seed_everything_default=0, save_config_kwargs={"overwrite": True},
                        parser_kwargs={"exit_on_error": False})  # the error, not the usage
        morpho = next(c for c in cli.trainer.callbacks if isinstance(c, MorphogenesisCallback))
        start = time.perf_counter()
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    except (ConfigError, DataError, ArgumentError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    assert morpho.engine is not None
    loss, accuracy = (cli.trainer.callback_metrics.get(k) for k in ("val_loss", "val_acc"))
    print(summary(morpho.engine, None if loss is None else float(loss),
                  None if accuracy is None else 100.0 * float(accuracy), seconds))
    if cli.config["timeline"]:
        save_timeline(morpho.engine.timeline, cli.config["timeline"],
                      slot_ids=morpho.engine.slot_ids, title="seed timeline (GPTHost tiny)")
        print(f"timeline: {cli.config['timeline']}")
    print(f"TensorBoard: tensorboard --logdir {cli.config['logdir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
