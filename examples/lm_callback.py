"""Grow seeds in a small byte-level GPT with a plain `lightning.Trainer`: drop-in growth for an LM.

    python examples/lm_callback.py --data ../shared/data/shakespeare/shakespeare.txt
    tensorboard --logdir runs/lm_callback

The ``tiny`` `GPTHost` (2 blocks, width 64, a slot after each block) learns to predict the next
byte of the text while a `HeuristicController` decides once per epoch whether to germinate a
transformer seed, advance, fossilize or prune it, and a `GovernorCallback` (vocabulary 256 for
its lobotomy rule) watches for divergence. Nothing in the growth code is specific to language
models: the callback reads ``(x, y)`` batches whose targets are ``[B, T]`` next tokens, so its
counterfactual measurement counts every token, and its contribution is next-token accuracy.

TensorBoard gets ``val_loss`` (mean per token), ``val_ppl`` (its exponential), ``val_acc``
(next-token accuracy), the ``morpho/*`` scalars (grouped per slot in the Custom Scalars tab) and
the seed timeline (Images tab). One line is printed per lifecycle event and a summary at the end.

Sizes (about 1.5 minutes on a busy 2-core CPU): 20 epochs of 1,280 random 64-byte blocks (40
steps of 32 blocks), validation on the first 256 blocks (16,384 bytes) of the held-out tail. The
heuristic's timing knobs scale with ``--epochs`` (`HeuristicConfig.reference_epochs`), and G2's
incubation is shortened to 2 epochs, so a seed germinated around epoch 4 blends in and is judged
before the end.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from esper_lightning.callbacks import GovernorCallback, MorphogenesisCallback
from esper_lightning.controllers import HeuristicController
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.data import ByteTokenizer, DataError, TextDataModule, find_text_file
from esper_lightning.hosts import GPTHost
from esper_lightning.viz import save_timeline


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a text file (or a folder holding one)")
    parser.add_argument("--epochs", type=int, default=20, help="epochs to train")
    parser.add_argument("--block-size", type=int, default=64, help="bytes per block")
    parser.add_argument("--batch-size", type=int, default=32, help="blocks per batch")
    parser.add_argument("--train-blocks", type=int, default=1280,
                        help="random training blocks per epoch")
    parser.add_argument("--val-blocks", type=int, default=256, help="validation blocks")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    parser.add_argument("--incubation", type=int, default=2,
                        help="epochs a seed trains before it may blend (G2)")
    parser.add_argument("--seed", type=int, default=0, help="random-number seed of the run")
    parser.add_argument("--logdir", default="runs/lm_callback", help="TensorBoard folder")
    parser.add_argument("--timeline", default=None, help="also save the seed timeline here")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser.parse_args(argv)


def summary(engine: MorphogenesisEngine, val_loss: float, val_acc: float, seconds: float) -> str:
    counts = engine.event_counts()
    rows = [
        ("validation loss", f"{val_loss:.4f} per token"),
        ("validation perplexity", f"{math.exp(val_loss):.3f}"),
        ("next-token accuracy", f"{val_acc:.2f}%"),
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    show_lifecycle_events()
    L.seed_everything(args.seed, verbose=False)
    try:
        data = TextDataModule(path=find_text_file(args.data), block_size=args.block_size,
                              batch_size=args.batch_size, train_blocks=args.train_blocks,
                              val_blocks=args.val_blocks, rng_seed=args.seed)
        data.setup()  # reads and checks the text before anything is logged (the fit reuses it)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    model = GPTHost("tiny", lr=args.lr)
    growth = MorphogenesisCallback(HeuristicController(), topology="transformer",
                                   gate_config=GateConfig(min_training_epochs=args.incubation))
    trainer = L.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=1, log_every_n_steps=10,
        callbacks=[GovernorCallback(num_classes=ByteTokenizer.vocab_size), growth],
        logger=TensorBoardLogger(args.logdir, name="gpt"), enable_model_summary=False,
        enable_progress_bar=not args.no_progress, enable_checkpointing=False,
    )
    start = time.perf_counter()
    try:
        trainer.fit(model, datamodule=data)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    assert growth.engine is not None
    metrics = trainer.callback_metrics
    print(summary(growth.engine, float(metrics["val_loss"]), 100.0 * float(metrics["val_acc"]),
                  seconds))
    if args.timeline:
        save_timeline(growth.engine.timeline, args.timeline, slot_ids=growth.engine.slot_ids,
                      title="seed timeline (GPTHost tiny)")
        print(f"timeline: {args.timeline}")
    print(f"TensorBoard: tensorboard --logdir {args.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
