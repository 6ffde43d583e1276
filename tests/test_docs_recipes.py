"""The README's and the growth tutorial's Python snippets, run as written.

Each snippet runs in a fresh folder holding what its text names (``shakespeare.txt``, long
enough that one epoch of the data module's defaults is longer than the whole budget: the case a
language-model user meets) and, where the text says "your model", a user's own model: a CNN
whose ``net.3`` and ``net.6`` are convolutions, a nanoGPT-style ``TinyGPT``. Nothing else is
changed: the data modules run with their defaults, the Trainers as the text builds them.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import ClassifierSteps
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from user_models import NanoGPT

from esper_lightning.callbacks import ComputeBudget, MorphogenesisCallback, WidthGrowthCallback
from esper_lightning.data import CIFAR10DataModule, write_cifar10_fixture

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("README.md", "docs/tutorials/grow-a-transformer.md")
_FENCE = re.compile(r"```python\n(.*?)```", re.S)
_WORDS = ("the", "king", "queen", "speaks", "to", "his", "her", "lord", "and", "lady", "of",
          "france", "with", "love", "war", "my", "good", "sir", "night", "sword", "crown")


def _snippets() -> list[tuple[str, int, str, str]]:
    """(source, index, prelude, code) of every distinct Python snippet; the prelude is the
    import lines of the snippets before it in its file (a reader has run them already)."""
    seen, found = set(), []
    for source in SOURCES:
        blocks = _FENCE.findall((ROOT / source).read_text())
        for index, code in enumerate(blocks):
            imports = [line for block in blocks[:index] for line in block.splitlines()
                       if line.startswith(("import ", "from "))]
            if code not in seen:
                seen.add(code)
                found.append((source, index, "\n".join(imports), code))
    return found


SNIPPETS = _snippets()


class TinyGPT(NanoGPT):
    """The reader's nanoGPT: its own blocks in ``self.blocks``, 32-token context."""

    def __init__(self) -> None:
        super().__init__(block_size=32)


class UserCNN(ClassifierSteps):
    """The reader's CIFAR-10 CNN: ``net.3`` and ``net.6`` are convolutions (the README's
    slots)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(16, 10),
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def write_long_text(path: Path, chars: int = 700_000) -> None:
    """Seeded pseudo-sentences: one epoch of `TextDataModule`'s defaults at block 32 is
    ``0.9 * chars / 32 / 32`` batches, more than any recipe's budget allows."""
    rng = random.Random(0)
    lines, size = [], 0
    while size < chars:
        line = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."
        lines.append(line)
        size += len(line) + 1
    path.write_text("\n".join(lines) + "\n")


def _scalars(log_dir: str) -> dict[str, list[float]]:
    events = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [s.value for s in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _callback(trainer: L.Trainer, kind: type) -> L.Callback:
    return next(c for c in trainer.callbacks if isinstance(c, kind))


@pytest.mark.parametrize(("source", "index", "prelude", "code"), SNIPPETS,
                         ids=[f"{Path(s).stem}-{i}" for s, i, _, _ in SNIPPETS])
def test_the_snippet_runs_as_written(source, index, prelude, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    write_long_text(tmp_path / "shakespeare.txt")
    namespace = {"TinyGPT": TinyGPT, "model": UserCNN(),
                 "dm": CIFAR10DataModule(write_cifar10_fixture(tmp_path / "cifar", n_train=64,
                                                               n_test=32, rng_seed=0))}
    exec(compile(prelude + "\n" + code, f"{source}[{index}]", "exec"), namespace)
    trainer = namespace["trainer"]
    morpho = _callback(trainer, MorphogenesisCallback)
    if "ComputeBudget" not in code:  # the drop-in callback: a whole run, the seeds decided
        assert trainer.current_epoch == trainer.max_epochs == 30
        return
    _check_growth(trainer, morpho, namespace, tmp_path)
    if "WidthGrowthCallback" in code:  # widened first, and handed back at its width
        width = _callback(trainer, WidthGrowthCallback)
        assert width.widened_step is not None and width.widening.hidden == (64, 128)
        assert namespace["lm"].model.config.n_embd == 128


def _check_growth(trainer: L.Trainer, morpho: MorphogenesisCallback, namespace: dict,
                  tmp_path: Path) -> None:
    """Growth at each tau within one step, the budget's most trained grown, and the model
    handed back at its new depth."""
    budget = _callback(trainer, ComputeBudget)
    assert budget.ledger.exhausted
    # The realistic case: the budget ended the fit inside its first epoch.
    assert trainer.global_step < trainer.num_training_batches
    kinds = [e.kind for e in morpho.engine.events]
    taus = morpho.controller.taus
    assert kinds == ["germinated", "fossilized"] * len(taus), morpho.engine.events
    scalars = _scalars(trainer.logger.log_dir)
    fractions, germinated = scalars["morpho/budget_fraction"], scalars["morpho/seeds_germinated"]
    per_step = budget.spent / budget.budget_flops / trainer.global_step * 4  # a grown step, at most
    for k, tau in enumerate(taus):
        grew = germinated.index(float(k + 1))  # the decision that germinated growth k
        assert tau <= fractions[grew] < tau + per_step
    assert 1.0 - fractions[germinated.index(1.0)] >= 0.5  # at least half trained grown
    if "lm" not in namespace:
        model = namespace["model"]
        assert morpho.engine.seed_params == 3 * sum(p.numel() for p in model.blocks[0].parameters())
        return
    from transformers import AutoModelForCausalLM

    lm = namespace["lm"].eval()
    assert len(lm.model.transformer.h) == 4 and lm.model.config.n_layer == 4
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "grown").eval()
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, lm(idx))


def test_the_recipes_need_no_hidden_setting():
    """What the growth recipes run with is the data module's defaults: no ``train_blocks`` or
    other knob the text does not show."""
    growth = [code for _, _, _, code in SNIPPETS if "ComputeBudget(" in code]
    assert len(growth) == 3
    for code in growth:
        assert 'TextDataModule("shakespeare.txt", block_size=32)' in code
        assert "train_blocks" not in code
