"""Grow your own small GPT from one block to four at half its compute budget.

    python examples/grow_gpt.py --text ../shared/data/shakespeare/shakespeare.txt
    tensorboard --logdir runs/grow_gpt

`TinyGPT` below is a user's own byte-level GPT `LightningModule`: its embeddings, head, steps and
AdamW optimizer are its own; only its layers are the library's transformer `Block`, which block
seeds build on. It starts with one block. Two callbacks do the rest:

* `MorphogenesisCallback` injects a slot after ``blocks.0`` whose block seeds stack three blocks
  (``growth_depth=3``), and a `StackController` germinates ``block_identity`` there at the first
  epoch's end past half the budget (``tau=0.5``): one decision grows the model to four blocks,
  each a copy of block 0 with its output projections at zero, so the model's function is
  unchanged at birth and the new blocks train at alpha 1 from the next step;
* `ComputeBudget` meters every training step's FLOPs (forward and backward, host and seed),
  schedules the learning rate over the share of the budget spent (warmup-stable-decay: every
  run reaches its floor at its budget), ends the fit there, and logs the validation loss
  against the training FLOPs spent (``compute/val_loss_vs_gflop``, step = GFLOP), next to the
  callback's ``morpho/*`` scalars and seed timeline.

The born-big baseline is the same script with four blocks from the start and a controller that
never grows (``--model.n_layer 4 --morpho.controller
esper_lightning.controllers.StaticController``); run both into one ``--logdir`` and TensorBoard
shows their losses on one compute axis. Whether growing wins at equal compute over many runs
is what the equal-compute measurements in docs/evidence.md answer.

Everything is a LightningCLI option (``--help``): the model (``--model.*``), the text
(``--data.*``), the Trainer (``--trainer.*``), the growth callback and its controller
(``--morpho.*``, e.g. ``--morpho.controller.tau 0.3``) and the budget (``--budget.*``). Short
flags: ``--text`` (a text file or a folder holding one), ``--gflops`` (the budget in GFLOP),
``--logdir``, ``--timeline``. How deep the model grows is one number,
``--morpho.growth_depth`` (blocks the slot's seed stacks): a `StackController`'s ``depth``,
``growth_depth`` and ``host_blocks`` follow it and ``--model.n_layer``.

Sizes (about a minute on one CPU core): width 32, 4 heads, 32-byte blocks (the shapes of the
``grow4`` GPT preset that ``compare --preset lm-grow`` measures); epochs of 40 steps of 32
random blocks, validation on the first 256 blocks of the held-out tail after each; a budget of
480 GFLOP, which the one-block model spends at 0.138 GFLOP a step and the four-block one at
0.403, so the model grows after about 1,740 steps (epoch 43) and trains about 600 more.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor, nn

from esper_lightning.blueprints.block import Block, init_gpt_weights, init_residual_projections
from esper_lightning.callbacks import ComputeBudget, MorphogenesisCallback
from esper_lightning.data import ByteTokenizer, DataError, TextDataModule, find_text_file
from esper_lightning.errors import ConfigError
from esper_lightning.viz import save_timeline

GFLOP = 1e9


class TinyGPT(L.LightningModule):
    """A byte-level GPT of ``n_layer`` transformer `Block`\\ s with tied embeddings.

    Args:
        n_layer: Blocks at birth (1: the callback grows the rest).
        width: Width of the residual stream.
        n_head: Attention heads (must divide ``width``).
        block_size: Longest sequence (the data's block size).
        lr: AdamW learning rate (`ComputeBudget` scales it over the budget).
        weight_decay: AdamW weight decay.
    """

    def __init__(self, n_layer: int = 1, width: int = 32, n_head: int = 4, block_size: int = 32,
                 lr: float = 8e-3, weight_decay: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        vocab = ByteTokenizer.vocab_size
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, n_head, depth=n_layer) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(init_gpt_weights)
        init_residual_projections(self, n_layer)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)  # [B, T, D]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # [B, T, 256]

    def _loss(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return loss, (logits.argmax(-1) == y).float().mean()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        loss, accuracy = self._loss(batch)  # Lightning weights each batch by its blocks
        self.log("val_loss", loss, prog_bar=True)
        self.log("val_acc", accuracy)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay,
                                 betas=(0.9, 0.95))


def _grown_depth(n_layer: int, growth_depth: int | None) -> int:
    """Blocks after one block seed grows in the slot."""
    return n_layer + (growth_depth or 1)


class GrowCLI(LightningCLI):
    """LightningCLI with the growth callback and the compute budget as configurable sections."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--text", default=None,
                            help="a text file, or a folder holding one (a single *.txt file)")
        parser.add_argument("--gflops", type=float, default=480.0,
                            help="the training budget in GFLOP (forward and backward)")
        parser.add_argument("--logdir", default="runs/grow_gpt",
                            help="TensorBoard folder (unless --trainer.logger is given)")
        parser.add_argument("--timeline", default=None,
                            help="also save the seed timeline image here (e.g. timeline.png)")
        parser.add_lightning_class_args(MorphogenesisCallback, "morpho")
        parser.add_lightning_class_args(ComputeBudget, "budget")
        parser.link_arguments("text", "data.path")
        parser.link_arguments("gflops", "budget.budget_flops", compute_fn=lambda g: g * GFLOP)
        parser.link_arguments("seed_everything", "data.rng_seed")
        parser.link_arguments("data.block_size", "model.block_size")
        # One number says how deep the model grows: a stacking controller's target follows the
        # model's blocks and the blocks the slot stacks (other controllers have no such knobs).
        parser.link_arguments(("model.n_layer", "morpho.growth_depth"),
                              "morpho.controller.init_args.depth", compute_fn=_grown_depth)
        parser.link_arguments("morpho.growth_depth", "morpho.controller.init_args.growth_depth")
        parser.link_arguments("model.n_layer", "morpho.controller.init_args.host_blocks")
        parser.set_defaults({
            "data.block_size": 32, "data.batch_size": 32, "data.train_blocks": 1280,
            "data.val_blocks": 256,
            "morpho.controller": {
                "class_path": "esper_lightning.controllers.StackController",
                "init_args": {"tau": 0.5, "init": "identity"},
            },
            "morpho.slots": ["blocks.0"], "morpho.growth_depth": 3,
            "morpho.topology": "transformer",
            "budget.lr_schedule": "wsd", "budget.warmup_fraction": 0.03,
            "budget.decay_fraction": 0.2,
            "trainer.max_epochs": -1,  # the budget ends the fit
            "trainer.accelerator": "cpu", "trainer.devices": 1, "trainer.log_every_n_steps": 10,
            "trainer.enable_model_summary": False, "trainer.enable_checkpointing": False,
        })

    def before_instantiate_classes(self) -> None:
        """``--text`` may name a folder: the data module reads the file it holds. The short
        flags are checked here, in one line each, before the links turn them into other
        classes' arguments (whose own messages would not name them)."""
        if self.config["text"] is None:
            raise ConfigError("no text to learn: pass --text FILE (a text file or a folder "
                              "holding one)")
        if not self.config["gflops"] > 0:
            raise ConfigError(f"--gflops must be a number > 0, got {self.config['gflops']}")
        depth = self.config["morpho"]["growth_depth"]
        if depth is not None and depth < 1:
            raise ConfigError(f"--morpho.growth_depth must be an int >= 1, got {depth}")
        self.config["data"]["path"] = str(find_text_file(self.config["text"]))

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        # Read the data first: a bad input fails before the Trainer and its logger exist.
        self.datamodule.prepare_data()
        self.datamodule.setup("fit")
        if self.config.get("trainer", {}).get("logger") is None:  # the default: TensorBoard
            kwargs["logger"] = TensorBoardLogger(self.config["logdir"], name="",
                                                 default_hp_metric=False)
        return super().instantiate_trainer(**kwargs)


def summary(model: TinyGPT, morpho: MorphogenesisCallback, budget: ComputeBudget,
            val_loss: float, seconds: float) -> str:
    engine = morpho.engine
    assert engine is not None
    blocks = sum(isinstance(m, Block) for m in model.modules())  # the seeds' blocks included
    rows = [
        ("validation loss", f"{val_loss:.4f} per byte"),
        ("blocks", f"{len(model.blocks)} -> {blocks}"),
        ("parameters", f"{engine.host_params:,} host + {engine.seed_params:,} grown"),
        ("training compute", f"{budget.spent / GFLOP:.1f} of {budget.budget_flops / GFLOP:.1f} "
                             f"GFLOP"),
        ("wall time", f"{seconds:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"epoch {e.epoch}: {e.slot_id} {e.kind} {e.blueprint} ({e.reason})"
              for e in engine.events]
    return "\n".join(lines)


def fit(argv: list[str] | None = None) -> tuple[GrowCLI, float]:
    """Parse ``argv``, fit, and return the CLI (its model, data and Trainer) and the seconds the
    fit took."""
    try:
        cli = GrowCLI(TinyGPT, TextDataModule, run=False, args=argv, seed_everything_default=0,
                      save_config_kwargs={"overwrite": True})
    except ValueError as err:  # a class refused its arguments (n_head=5 for width 32), one line
        raise ConfigError(str(err)) from err
    start = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    # The seed is in the run's config.yaml: an error is then the only line a bad input prints.
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    try:
        cli, seconds = fit(argv)
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    callbacks = cli.trainer.callbacks
    morpho = next(c for c in callbacks if isinstance(c, MorphogenesisCallback))
    budget = next(c for c in callbacks if isinstance(c, ComputeBudget))
    val_loss = float(cli.trainer.callback_metrics["val_loss"])
    print(summary(cli.model, morpho, budget, val_loss, seconds))
    if cli.config["timeline"]:
        assert morpho.engine is not None
        save_timeline(morpho.engine.timeline, cli.config["timeline"],
                      slot_ids=morpho.engine.slot_ids, title="seed timeline (TinyGPT)")
        print(f"timeline: {cli.config['timeline']}")
    print(f"TensorBoard: tensorboard --logdir {cli.config['logdir']}  (compute/val_loss_vs_gflop: "
          "validation loss against training GFLOP)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
