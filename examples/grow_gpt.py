"""Grow your own small GPT from one block to four at a quarter of its compute budget.

    python examples/grow_gpt.py --text ../shared/data/shakespeare/shakespeare.txt
    tensorboard --logdir runs/grow_gpt

`TinyGPT` below is a byte-level GPT `LightningModule` written as a user writes one: its own
transformer `Block` class (pre-norm, causal self-attention, GELU MLP), embeddings, head, steps
and AdamW with nanoGPT's weight-decay groups. Nothing in it knows about growth. It starts with
one block. Two callbacks do the rest:

* `MorphogenesisCallback` with ``growth=DepthGrowth("blocks", blocks=3)`` puts a growth slot
  after the last of ``self.blocks``, and a `StackController` germinates the ``identity`` growth
  operator there before the first training step past a quarter of the budget (``tau=0.25``; the
  callback decides there, mid-epoch, not at the next validation): one decision grows the model
  to four blocks, each a copy of block 0 (of the user's own class) with its
  residual output projections at zero, so the model's function is unchanged at birth and the
  new blocks train at alpha 1 from the next step. They join the AdamW groups of the blocks they
  were copied from;
* `ComputeBudget` meters every training step's FLOPs (forward and backward, host and seed),
  schedules the learning rate over the share of the budget spent (warmup-stable-decay: every
  run reaches its floor at its budget), ends the fit there, and logs the validation loss
  against the training FLOPs spent (``compute/val_loss_vs_flops``), next to the callback's
  ``morpho/*`` scalars and seed timeline.

The born-big baseline is the same script with four blocks from the start and a controller that
never grows (``--model.n_layer 4 --morpho.controller
esper_lightning.controllers.StaticController``); run both into one ``--logdir`` and TensorBoard
shows their losses on one compute axis. Whether growing wins at equal compute over many runs
is what the frontier measurements in docs/evidence.md answer.

Everything is a LightningCLI option (``--help``): the model (``--model.*``), the text
(``--data.*``), the Trainer (``--trainer.*``), the growth callback and its controller
(``--morpho.*``, e.g. ``--morpho.controller.tau 0.3``) and the budget (``--budget.*``). Short
flags: ``--text`` (a text file or a folder holding one), ``--gflops`` (the budget in GFLOP),
``--logdir``, ``--timeline``. How deep the model grows is one number, ``--grow`` (blocks the
growth event adds: ``DepthGrowth(blocks=...)``).

Sizes (about a minute on one CPU core): width 32, 4 heads, 32-byte blocks in batches of 32, the
data module's defaults otherwise (one epoch of Shakespeare is about 4,300 steps, longer than the
whole budget: the loop a language-model user runs); validation on 256 blocks of the validation
split every 200 steps (``--trainer.val_check_interval``); a budget of 480 GFLOP, which the
one-block model spends at 0.138 GFLOP a step and the four-block one at 0.403, so the model grows
after about 870 steps and trains about 890 more, three quarters of the budget.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from argparse import ArgumentError
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor, nn

from esper_lightning.callbacks import ComputeBudget, MorphogenesisCallback
from esper_lightning.data import ByteTokenizer, DataError, TextDataModule, find_text_file
from esper_lightning.errors import ConfigError
from esper_lightning.viz import save_timeline

GFLOP = 1e9


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position ``t`` sees positions ``<= t`` only."""

    def __init__(self, width: int, n_head: int) -> None:
        super().__init__()
        if width % n_head:
            raise ValueError(f"n_head={n_head} must divide the width {width}")
        self.n_head = n_head
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=-1)  # [B, T, D] each
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D / H]
        return self.c_proj(y.transpose(1, 2).flatten(2))  # [B, T, D]


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(LN x)``, then ``x + mlp(LN x)`` on ``[B, T, D]``."""

    def __init__(self, width: int, n_head: int) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(width), CausalSelfAttention(width, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(width), MLP(width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(L.LightningModule):
    """A byte-level GPT of ``n_layer`` of its own `Block`\\ s, with tied embeddings.

    Args:
        n_layer: Blocks at birth (1: the callback grows the rest).
        width: Width of the residual stream.
        n_head: Attention heads (must divide ``width``).
        block_size: Longest sequence (the data's block size).
        lr: AdamW learning rate (`ComputeBudget` scales it over the budget).
        weight_decay: AdamW weight decay on the matrices.
    """

    def __init__(self, n_layer: int = 1, width: int = 32, n_head: int = 4, block_size: int = 32,
                 lr: float = 8e-3, weight_decay: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        vocab = ByteTokenizer.vocab_size
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """GPT-2's init (the ``random`` growth operator re-initialises new blocks with it)."""
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, Block):  # residual projections scaled for the depth
            std = 0.02 / math.sqrt(2 * self.hparams.n_layer)
            for projection in (module.attn.c_proj, module.mlp.c_proj):
                nn.init.normal_(projection.weight, std=std)

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

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        loss, _ = self._loss(batch)
        # "loss" reaches on_train_batch_end divided by any gradient accumulation; "train_loss"
        # as it is.
        return {"loss": loss, "train_loss": loss.detach()}

    def on_train_batch_end(self, outputs: dict[str, Tensor], batch: Any, batch_idx: int) -> None:
        # Logged on the steps the logger writes (and the one the budget ends), not every step:
        # one `self.log` costs about a millisecond on a CPU, 7 % of this model's step there.
        trainer = self.trainer
        every = trainer.log_every_n_steps
        if every and (trainer.global_step % every == 0 or trainer.should_stop):
            self.log("train_loss", outputs["train_loss"], prog_bar=True)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        loss, accuracy = self._loss(batch)  # Lightning weights each batch by its blocks
        self.log("val_loss", loss, prog_bar=True)
        self.log("val_acc", accuracy)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        params = list(self.parameters())
        return torch.optim.AdamW([
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": hp.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ], lr=hp.lr, betas=(0.9, 0.95))


def _growth(blocks: int) -> dict[str, Any] | None:
    """A growth slot on top of ``self.blocks`` adding ``blocks`` blocks in one event (None for a
    bad ``--grow``, which `GrowCLI.before_instantiate_classes` refuses in one line).

    The `DepthGrowth` arguments, not the instance: jsonargparse instantiates the dataclass from
    them, and LightningCLI's dump of the config (the model's hyperparameters, config.yaml) can
    write them back, where an instance would print a JsonargparseWarning on every run."""
    return {"stack": "blocks", "blocks": blocks} if blocks >= 1 else None


class BudgetProgressBar(TQDMProgressBar):
    """The progress bar of a fit the compute budget ends: the epoch without a total (the Trainer's
    ``max_epochs`` is -1, which Lightning's default bar shows as ``Epoch 58/-2``) and the share
    of the budget spent beside the loss."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule
                    ) -> dict[str, int | str | float | dict[str, float]]:
        metrics = super().get_metrics(trainer, pl_module)
        budget = next((c for c in trainer.callbacks if isinstance(c, ComputeBudget)), None)
        if budget is not None:
            metrics["budget"] = f"{budget.budget_fraction:.0%}"
        return metrics


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
        parser.add_argument("--grow", type=int, default=3,
                            help="blocks the growth event adds on top of the model's blocks")
        parser.add_lightning_class_args(MorphogenesisCallback, "morpho")
        parser.add_lightning_class_args(ComputeBudget, "budget")
        parser.link_arguments("text", "data.path")
        parser.link_arguments("gflops", "budget.budget_flops", compute_fn=lambda g: g * GFLOP)
        parser.link_arguments("seed_everything", "data.rng_seed")
        parser.link_arguments("data.block_size", "model.block_size")
        parser.link_arguments("grow", "morpho.growth", compute_fn=_growth)
        parser.set_defaults({
            "data.block_size": 32, "data.batch_size": 32, "data.val_blocks": 256,
            "morpho.controller": {
                "class_path": "esper_lightning.controllers.StackController",
                "init_args": {"tau": 0.25, "operator": "identity"},
            },
            "budget.lr_schedule": "wsd", "budget.warmup_fraction": 0.03,
            "budget.decay_fraction": 0.2,
            "trainer.max_epochs": -1,  # the budget ends the fit
            # One long epoch: validate every 200 steps, counted across epochs.
            "trainer.val_check_interval": 200, "trainer.check_val_every_n_epoch": None,
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
        if not self.config["grow"] >= 1:
            raise ConfigError(f"--grow must be an int >= 1, got {self.config['grow']}")
        # The text named is the one to learn: no download offered in its place.
        self.config["data"]["path"] = str(find_text_file(self.config["text"], downloadable=False))

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        # Read the data first: a bad input fails before the Trainer and its logger exist.
        self.datamodule.prepare_data()
        self.datamodule.setup("fit")
        if self.config.get("trainer", {}).get("logger") is None:  # the default: TensorBoard
            kwargs["logger"] = TensorBoardLogger(self.config["logdir"], name="",
                                                 default_hp_metric=False)
        trainer = self.config_init.get("trainer", {})  # callbacks instantiated
        given = trainer.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        if trainer.get("enable_progress_bar") is not False and not any(
                isinstance(c, ProgressBar) for c in given):  # a bar of the user's own stays
            kwargs["callbacks"] = [*given, BudgetProgressBar()]
        return super().instantiate_trainer(**kwargs)


def summary(model: TinyGPT, morpho: MorphogenesisCallback, budget: ComputeBudget,
            val_loss: float | None, seconds: float) -> str:
    engine = morpho.engine
    assert engine is not None
    blocks = sum(isinstance(m, Block) for m in model.modules())  # the grown blocks included
    rows = [
        ("validation loss", f"{val_loss:.4f} per byte" if val_loss is not None
                            else "none: the fit ended before its first validation"),
        ("blocks", f"{len(model.blocks)} -> {blocks}"),
        ("parameters", f"{engine.host_params:,} host + {engine.seed_params:,} grown"),
        ("training compute", f"{budget.spent / GFLOP:.1f} of {budget.budget_flops / GFLOP:.1f} "
                             f"GFLOP"),
        ("wall time", f"{seconds:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"decision {e.epoch}: {e.slot_id} {e.kind} {e.blueprint} ({e.reason})"
              for e in engine.events]
    return "\n".join(lines)


def fit(argv: list[str] | None = None) -> tuple[GrowCLI, float]:
    """Parse ``argv``, fit, and return the CLI (its model, data and Trainer) and the seconds the
    fit took."""
    try:
        cli = GrowCLI(TinyGPT, TextDataModule, run=False, args=argv, seed_everything_default=0,
                      save_config_kwargs={"overwrite": True},
                      parser_kwargs={"exit_on_error": False})  # the error alone, not the usage
    except ArgumentError as err:  # a value the parser refused: its message on one line
        raise ConfigError(" ".join(str(err).split())) from None
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
    val_loss = cli.trainer.callback_metrics.get("val_loss")
    print(summary(cli.model, morpho, budget, None if val_loss is None else float(val_loss),
                  seconds))
    if cli.config["timeline"]:
        assert morpho.engine is not None
        save_timeline(morpho.engine.timeline, cli.config["timeline"],
                      slot_ids=morpho.engine.slot_ids, title="seed timeline (TinyGPT)")
        print(f"timeline: {cli.config['timeline']}")
    print(f"TensorBoard: tensorboard --logdir {cli.config['logdir']}  (compute/val_loss_vs_flops: "
          "validation loss against training FLOPs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
