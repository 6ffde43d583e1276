"""Seeds on a user's short run: the callback's defaults against the same Trainer without it.

    OMP_NUM_THREADS=1 python scripts/short_run_study.py --data-dir ../shared/data/cifar10-subset \\
        --episodes 10 --root 52005 --epochs 15 --subset 3000 --threads 1 \\
        --out results/short-runs/rows.csv
    python scripts/short_run_study.py --report --out results/short-runs/rows.csv \\
        --summary results/short-runs/summary.md

Models written the way a user writes them, none of them the project's hosts: a small CNN
(conv-relu-pool ×2, linear; SGD with momentum), a small ResNet (a stem, three BasicBlocks with
BatchNorm and a skip, global pool, linear; SGD with momentum), an MLP on flattened images
(three hidden layers; AdamW) and the CNN again with AdamW. Each is a plain LightningModule that
logs ``val_loss`` and ``val_acc`` and imports nothing from esper_lightning.

Two arms per model and episode: ``plain`` (the Trainer without callbacks) and ``heuristic``
(the same Trainer with ``GovernorCallback(num_classes=10)`` and
``MorphogenesisCallback(HeuristicController(), slots=...)``, every other option at its
default). Episode ``i`` of both arms runs after ``seed_everything(root + i)`` with the data
module's ``rng_seed = root + i``: the same initial weights, training subset, batch order and
augmentation, so the arms pair by episode.

The CSV gets one row per model × episode × arm, appended as each run ends; a restart skips the
rows already there (so an interrupted study resumes where it stopped). ``--report`` reads the
CSV and writes a Markdown table: per model, how often a seed was kept, the seeds germinated,
and the paired accuracy difference heuristic − plain with a 95 % t interval and a Wilcoxon
signed-rank p beside it. Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
# Measure the checkout this script lives in (a pinned `git worktree`, say), not whichever one
# `pip install -e` points at: otherwise edits to the main tree would reach a running study.
sys.path.insert(0, str(ROOT))

#: The columns of the CSV, in order.
COLUMNS = (
    "model", "episode", "arm", "seed", "max_epochs", "subset", "batch_size",
    "val_acc", "test_acc", "epochs_run", "germinated", "fossilized", "pruned", "events",
    "rollbacks", "wall_s", "threads", "commit",
)
#: The settings every row of one CSV must share: rows with other settings do not pair.
SETTINGS = ("max_epochs", "subset", "batch_size")
ARMS = ("plain", "heuristic")


class StudyError(Exception):
    """Bad input: printed as one line, exit status 2."""


# ------------------------------------------------------------------------- the users' models


class ClassifierSteps(L.LightningModule):
    """What a user's classifier does in every step: cross-entropy on ``self.net``'s logits with
    ``train_loss``, ``val_loss`` and ``val_acc`` logged (as tests/helpers.py's does)."""

    net: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())


def small_cnn() -> nn.Sequential:
    """conv-relu-pool twice, then a linear classifier on the flattened 8×8 maps."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10),
    )


class BasicBlock(nn.Module):
    """The ResNet basic block: two 3×3 convs with BatchNorm, plus the input (projected by a
    1×1 conv when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """A stem (conv, BN, ReLU, 2×2 max-pool: one CPU thread cannot afford 32×32 blocks), three
    basic blocks (16, 32, 64 channels), global average pool and a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.layer3 = BasicBlock(32, 64, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def small_mlp() -> nn.Sequential:
    """Flattened 3×32×32 images through three hidden ReLU layers (512, 256, 128)."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(3 * 32 * 32, 512), nn.ReLU(),
        nn.Linear(512, 256), nn.ReLU(),
        nn.Linear(256, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )


def sgd(params, lr: float = 0.05) -> torch.optim.Optimizer:
    """SGD with momentum, as a user's CIFAR recipe has it."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=5e-4)


def adamw(params) -> torch.optim.Optimizer:
    """AdamW at PyTorch's usual lr and weight decay."""
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


class UserClassifier(ClassifierSteps):
    """A user's LightningModule: a network and an optimizer, nothing from esper_lightning.

    Args:
        build: makes the network (``self.net``).
        optimizer: makes the optimizer from the parameters.
    """

    def __init__(self, build: Callable[[], nn.Module],
                 optimizer: Callable[..., torch.optim.Optimizer]) -> None:
        super().__init__()
        self.net = build()
        self.make_optimizer = optimizer

    def configure_optimizers(self):
        return self.make_optimizer(self.parameters())


@dataclass(frozen=True)
class ModelSpec:
    """One user-style model of the study: how to build it and where slots go."""

    build: Callable[[], nn.Module]
    optimizer: Callable[..., torch.optim.Optimizer]
    slots: tuple[str, ...]
    about: str


#: The study's models; slots sit after a conv stage (cnn, resnet) or a hidden layer (mlp).
MODELS: dict[str, ModelSpec] = {
    "cnn": ModelSpec(small_cnn, sgd, ("net.2", "net.5"),
                     "conv16-relu-pool, conv32-relu-pool, linear; SGD lr 0.05 momentum 0.9"),
    "resnet": ModelSpec(SmallResNet, sgd, ("net.layer1", "net.layer2"),
                        "stem16 + pool, BasicBlocks 16/32/64 with BN, avg pool, linear; "
                        "SGD lr 0.05 momentum 0.9"),
    "mlp": ModelSpec(small_mlp, adamw, ("net.2", "net.4"),
                     "3072-512-256-128-10 ReLU MLP; AdamW lr 1e-3 wd 0.01"),
    "cnn-adamw": ModelSpec(small_cnn, adamw, ("net.2", "net.5"),
                           "the cnn with AdamW lr 1e-3 wd 0.01"),
}


# -------------------------------------------------------------------------------- one run


def _quiet() -> None:
    """Keep the log to one line per run: Lightning's banners and the library's INFO lines
    would drown it over a few hundred fits."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "esper_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # A user's short run draws Lightning's "few workers" and "small log interval" hints; they
    # are the same in both arms and say nothing about the study.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*log_every_n_steps.*")


def _accuracy(model: nn.Module, loader) -> float:
    """Top-1 accuracy of ``model`` over ``loader``, in eval mode without gradients."""
    was_training = model.training
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train(was_training)
    return correct / total


def run_episode(name: str, episode: int, arm: str, args: argparse.Namespace,
                commit: str) -> dict[str, object]:
    """Train model ``name`` for one episode of one arm and return its CSV row."""
    from esper_lightning import GovernorCallback, HeuristicController, MorphogenesisCallback
    from esper_lightning.data import CIFAR10DataModule

    spec = MODELS[name]
    seed = args.root + episode
    L.seed_everything(seed, verbose=False)  # same initial weights in both arms
    dm = CIFAR10DataModule(args.data_dir, batch_size=args.batch_size, subset=args.subset,
                           rng_seed=seed)  # same subset, order and augmentation
    model = UserClassifier(spec.build, spec.optimizer)
    callbacks: list[L.Callback] = []
    morpho = governor = None
    if arm == "heuristic":
        governor = GovernorCallback(num_classes=10)  # listed first, as the README says
        morpho = MorphogenesisCallback(HeuristicController(), slots=list(spec.slots))
        callbacks = [governor, morpho]
    trainer = L.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=1, callbacks=callbacks,
        # No files and no progress bar in either arm (a logger and checkpoints are the same
        # for both and would only write to disk).
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    wall = time.perf_counter() - start
    dm.setup("test")
    row: dict[str, object] = {
        "model": name, "episode": episode, "arm": arm, "seed": seed,
        "max_epochs": args.epochs, "subset": args.subset, "batch_size": args.batch_size,
        "val_acc": round(float(trainer.callback_metrics["val_acc"]), 6),
        "test_acc": round(_accuracy(model, dm.test_dataloader()), 6),
        "epochs_run": trainer.current_epoch, "germinated": 0, "fossilized": 0, "pruned": 0,
        "events": "", "rollbacks": 0, "wall_s": round(wall, 2),
        "threads": torch.get_num_threads(), "commit": commit,
    }
    if morpho is not None and governor is not None:
        engine = morpho.engine
        assert engine is not None
        counts = engine.event_counts()
        row.update(
            germinated=counts["germinated"], fossilized=counts["fossilized"],
            pruned=counts["pruned"], rollbacks=governor.rollbacks,
            events=" | ".join(f"{e.epoch}:{e.slot_id}:{e.kind}:{e.blueprint}:{e.reason}"
                              for e in engine.events),
        )
    return row


# -------------------------------------------------------------------------------- the CSV


def read_rows(path: Path) -> list[dict[str, str]]:
    """The CSV's rows (none when the file does not exist yet)."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise StudyError(f"{path} has columns {reader.fieldnames}, not this script's "
                             f"{list(COLUMNS)}")
        return list(reader)


def check_settings(rows: Sequence[dict[str, str]], args: argparse.Namespace,
                   path: Path) -> None:
    """Refuse to resume a CSV written with other epochs, subset or batch size."""
    wanted = {"max_epochs": args.epochs, "subset": args.subset, "batch_size": args.batch_size}
    for row in rows:
        for key in SETTINGS:
            if row[key] != str(wanted[key]):
                raise StudyError(f"{path} holds rows with {key}={row[key]}, not {wanted[key]}: "
                                 "pass the same settings to resume, or another --out")
        if int(row["seed"]) - int(row["episode"]) != args.root:
            raise StudyError(f"{path} holds rows with root {int(row['seed']) - int(row['episode'])}"
                             f", not {args.root}: pass the same --root to resume")


def append_row(path: Path, row: dict[str, object]) -> None:
    """Append one row (with the header when the file is new) and flush it to disk, so an
    interrupted study loses at most the run in progress."""
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)
        f.flush()
        os.fsync(f.fileno())


def _commit() -> str:
    """The checkout's commit (``-dirty`` when it has changes), for the rows' provenance."""
    def git(*cmd: str) -> str:
        out = subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""
    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "esper_lightning")
    return head + ("-dirty" if dirty else "")


def run_study(args: argparse.Namespace) -> int:
    """Play every missing model × episode × arm, appending each row as it ends."""
    from esper_lightning.data import CIFAR10DataModule, DataError

    torch.set_num_threads(args.threads)
    _quiet()
    out = Path(args.out)
    done = read_rows(out)
    check_settings(done, args, out)
    have = {(r["model"], int(r["episode"]), r["arm"]) for r in done}
    commit = _commit()
    try:  # a missing folder or a subset larger than the data: one line before any run
        CIFAR10DataModule(args.data_dir, subset=args.subset).setup("fit")
    except (DataError, ValueError) as err:
        raise StudyError(str(err)) from err
    todo = [(e, m, a) for e in range(args.episodes) for m in args.models for a in ARMS
            if (m, e, a) not in have]
    import esper_lightning

    print(f"{len(have)} rows in {out}, {len(todo)} to run; {args.threads} thread(s), "
          f"commit {commit} ({Path(esper_lightning.__file__).parent}), "
          f"python {platform.python_version()}, torch {torch.__version__}", flush=True)
    # Episode-major order: a study stopped early still has every model at about the same N.
    for episode, name, arm in todo:
        row = run_episode(name, episode, arm, args, commit)
        append_row(out, row)
        print(f"{name} episode {episode} {arm}: val {row['val_acc']:.4f} test "
              f"{row['test_acc']:.4f} germinated {row['germinated']} fossilized "
              f"{row['fossilized']} pruned {row['pruned']} rollbacks {row['rollbacks']} "
              f"{row['wall_s']:.1f} s", flush=True)
    return 0


# ------------------------------------------------------------------------------ the report


@dataclass(frozen=True)
class Paired:
    """One model's paired comparison of an accuracy, heuristic − plain, in points."""

    n: int
    plain: float
    heuristic: float
    diff: float
    ci: tuple[float, float] | None
    wilcoxon: float


def paired(pairs: Sequence[tuple[float, float]]) -> Paired:
    """Mean accuracies and the mean difference heuristic − plain (in percentage points) of
    ``(plain, heuristic)`` pairs (fractions in [0, 1]), with its 95 % t interval and the
    two-sided Wilcoxon signed-rank p of the differences."""
    from esper_lightning.app.compare.stats import mean_ci, wilcoxon_p

    plain = np.array([p for p, _ in pairs]) * 100.0
    heur = np.array([h for _, h in pairs]) * 100.0
    d = heur - plain
    return Paired(len(pairs), float(plain.mean()), float(heur.mean()), float(d.mean()),
                  mean_ci(d), wilcoxon_p(d))


def _verdict(result: Paired, p_adjusted: float) -> str:
    from esper_lightning.app.compare.stats import verdict

    return verdict(result.ci, p_adjusted, result.n)


def _signed(x: float) -> str:
    # "+ 0.0" turns a rounded −0.00 into +0.00: a difference too small to print has no sign.
    return f"{round(x, 2) + 0.0:+.2f}".replace("-", "−")


def _interval(ci: tuple[float, float] | None) -> str:
    return "—" if ci is None else f"[{_signed(ci[0])}, {_signed(ci[1])}]"


def report(rows: Sequence[dict[str, str]]) -> str:
    """The Markdown summary of a study's rows (see the module docstring)."""
    from esper_lightning.app.compare.stats import holm

    if not rows:
        raise StudyError("the CSV holds no rows")
    by_key = {(r["model"], int(r["episode"]), r["arm"]): r for r in rows}
    names = [m for m in MODELS if any(r["model"] == m for r in rows)]
    names += sorted({r["model"] for r in rows} - set(names))
    settings = sorted({tuple(r[k] for k in SETTINGS) for r in rows})
    lines = [
        "| model | pairs | kept rate | runs that germinated | seeds germinated | fossilized "
        "| pruned | rollbacks | plain test acc | heuristic test acc | Δ test (pp) "
        "| 95 % t interval | Wilcoxon p "
        "| verdict (test) | Δ val (pp) | 95 % t interval (val) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    results: list[tuple[str, int, list[dict[str, str]], Paired, Paired]] = []
    unpaired = 0
    for name in names:
        episodes = sorted({e for (m, e, _) in by_key if m == name})
        both = [e for e in episodes
                if (name, e, "plain") in by_key and (name, e, "heuristic") in by_key]
        unpaired += len(episodes) - len(both)
        if not both:
            continue
        heur = [by_key[(name, e, "heuristic")] for e in both]
        test = paired([(float(by_key[(name, e, "plain")]["test_acc"]),
                        float(by_key[(name, e, "heuristic")]["test_acc"])) for e in both])
        val = paired([(float(by_key[(name, e, "plain")]["val_acc"]),
                       float(by_key[(name, e, "heuristic")]["val_acc"])) for e in both])
        results.append((name, len(both), heur, test, val))
    if not results:
        raise StudyError("the CSV holds no episode with both arms")
    # Holm over the models: the table is one family of tests.
    adjusted = holm([test.wilcoxon for *_, test, _ in results])
    for (name, n, heur, test, val), p_adj in zip(results, adjusted, strict=True):
        kept = sum(int(r["fossilized"]) > 0 for r in heur)
        grew = sum(int(r["germinated"]) > 0 for r in heur)
        lines.append(
            f"| {name} | {n} | {kept}/{n} ({100 * kept / n:.0f} %) | {grew}/{n} "
            f"| {sum(int(r['germinated']) for r in heur)} "
            f"| {sum(int(r['fossilized']) for r in heur)} "
            f"| {sum(int(r['pruned']) for r in heur)} "
            f"| {sum(int(r['rollbacks']) for r in heur)} "
            f"| {test.plain:.2f} | {test.heuristic:.2f} | {_signed(test.diff)} "
            f"| {_interval(test.ci)} | {_fmt_p(test.wilcoxon)} | {_verdict(test, p_adj)} "
            f"| {_signed(val.diff)} | {_interval(val.ci)} |"
        )
    notes = [
        "",
        f"Settings (max_epochs, subset, batch_size): "
        f"{', '.join('(' + ', '.join(s) + ')' for s in settings)}. "
        "Accuracies in percent; Δ = heuristic − plain in percentage points, paired by episode.",
        "Kept rate: heuristic runs with at least one fossilized seed; runs that germinated: "
        "heuristic runs with at least one germination (a run without one trains exactly as "
        "its plain pair: the same numbers). The verdict is `better` or "
        "`worse` only when the 95 % t interval excludes 0 and the Wilcoxon p, Holm-adjusted "
        "over the table's models, is below 0.05.",
    ]
    if unpaired:
        notes.append(f"{unpaired} episode(s) with one arm only are left out.")
    reasons = _prune_reasons(rows)
    if reasons:
        notes.append("Prune reasons (heuristic runs): " + "; ".join(
            f"{reason} ×{count}" for reason, count in reasons) + ".")
    walls = _walls(rows)
    notes.append("Mean wall seconds per run (plain / heuristic): " + ", ".join(
        f"{name} {w[0]:.1f} / {w[1]:.1f}" for name, w in walls.items()) + ".")
    return "\n".join(lines + notes) + "\n"


def _fmt_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _prune_reasons(rows: Sequence[dict[str, str]]) -> list[tuple[str, int]]:
    """How often each prune reason occurs in the rows' events, most frequent first."""
    counts: dict[str, int] = {}
    for row in rows:
        for event in filter(None, row["events"].split(" | ")):
            _, _, kind, _, reason = event.split(":", 4)
            if kind == "pruned":
                # Numbers in a reason differ run by run; the words say why.
                words = " ".join(w for w in reason.split() if not any(c.isdigit() for c in w))
                counts[words] = counts.get(words, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _walls(rows: Sequence[dict[str, str]]) -> dict[str, tuple[float, float]]:
    """Mean wall seconds per run of each model's plain and heuristic arms."""
    out: dict[str, tuple[float, float]] = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        means = []
        for arm in ARMS:
            walls = [float(r["wall_s"]) for r in rows if r["model"] == name and r["arm"] == arm]
            means.append(sum(walls) / len(walls) if walls else math.nan)
        out[name] = (means[0], means[1])
    return out


# ---------------------------------------------------------------------------------- command


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, checked (`StudyError` on a bad value)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None,
                        help="folder with cifar-10-batches-py/ (default: $ESPER_DATA_DIR)")
    parser.add_argument("--models", nargs="+", default=["cnn", "resnet", "mlp"],
                        help=f"models to run, of {', '.join(MODELS)}")
    parser.add_argument("--episodes", type=int, default=10, help="paired episodes per model")
    parser.add_argument("--root", type=int, default=52005,
                        help="root seed: episode i uses root + i")
    parser.add_argument("--epochs", type=int, default=15, help="max_epochs of every run")
    parser.add_argument("--subset", type=int, default=3000, help="training images per episode")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--out", default="results/short-runs/rows.csv", help="the CSV")
    parser.add_argument("--report", action="store_true",
                        help="write the Markdown summary of --out instead of running")
    parser.add_argument("--summary", default=None,
                        help="where --report writes (default: summary.md beside --out)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise StudyError(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    if len(set(args.models)) != len(args.models):
        raise StudyError("--models names a model twice")
    for name in ("episodes", "epochs", "subset", "batch_size", "threads"):
        if getattr(args, name) < 1:
            raise StudyError(f"--{name.replace('_', '-')} must be >= 1, "
                             f"got {getattr(args, name)}")
    if args.root < 0:
        raise StudyError(f"--root must be >= 0, got {args.root}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the study or (``--report``) write its summary; 2 on bad input."""
    try:
        args = parse_args(argv)
        if args.report:
            out = Path(args.out)
            if not out.exists():
                raise StudyError(f"{out} does not exist")
            text = report(read_rows(out))
            summary = Path(args.summary) if args.summary else out.with_name("summary.md")
            summary.write_text(text)
            print(text, end="")
            print(f"written: {summary}")
            return 0
        return run_study(args)
    except StudyError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
