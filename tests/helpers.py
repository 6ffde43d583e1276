"""Test helpers shared by several test files: tiny models, a checkpoint round trip, a trained
smoke policy, files that are no checkpoint, the example loader, a local DDP rendezvous and the
data tests' batch and message checks.

Imported as ``from helpers import ...``: pytest puts ``tests/`` (not a package) on ``sys.path``,
as for ``thread_ranks`` and ``lifecycle_mdp``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import multiprocessing
import random
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from esper_lightning.core import SeedSlot

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------------- models


def user_cnn(width: int = 8) -> nn.Sequential:
    """A user's small CIFAR classifier, slot-free: ``net.1`` / ``net.3`` / ``net.4`` are where
    the tests inject slots (after the first ReLU, after the pool, after the second conv)."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, 10),
    )


class UserNet(nn.Module):
    """A user's model without slots of its own: slots are injected by module path."""

    def __init__(self) -> None:
        super().__init__()
        self.net = user_cnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ClassifierSteps(L.LightningModule):
    """What a user's classifier does in every step: cross-entropy on ``self.net``'s logits, with
    ``train_loss``, ``val_loss`` and ``val_acc`` logged; a subclass builds ``net`` and its
    optimizer (nothing here comes from esper_lightning)."""

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


class UserModule(ClassifierSteps):
    """A user's LightningModule that imports nothing from esper_lightning: slots are injected by
    module path (``net.3``, ...).

    Args:
        width: Channels of the first convolution (a hyper-parameter, saved for
            ``load_from_checkpoint``).
        step_lr: Halve the learning rate every 2 epochs (``StepLR``), so the tests can watch the
            seed param groups follow a scheduler; plain SGD otherwise.
    """

    def __init__(self, width: int = 8, step_lr: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = user_cnn(width)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        if not self.hparams.step_lr:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class TinyHost(nn.Module):
    """conv(3→8) → slot → conv(8→4); the slot is ``SeedSlot("s", channels=8)`` unless given."""

    def __init__(self, slot: SeedSlot | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.slot = slot if slot is not None else SeedSlot("s", channels=8)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.relu(self.slot(torch.relu(self.conv1(x)))))


# ------------------------------------------------------------------- runs and processes


def torch_round_trip(state: Any) -> Any:
    """``state`` through ``torch.save`` / ``torch.load(weights_only=True)``, as checkpoints are."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)



def train_smoke_policy(root: Path) -> tuple[Path, Path]:
    """Train a one-round PPO policy (``smoke`` preset, episodes of 3 epochs) on a fixture in
    ``root``; returns ``(data folder, checkpoint)``."""
    # Imported here: only the tests that need a trained policy pay for the application.
    from esper_lightning.app.config import load_config
    from esper_lightning.app.ppo.trainer import PPOTrainer
    from esper_lightning.data import write_cifar10_fixture

    data = write_cifar10_fixture(root / "data", n_train=64, n_test=32)
    save = root / "ckpt.pt"
    config = load_config("smoke", overrides={
        "data_dir": str(data), "rounds": 1, "episode_length": 3, "logdir": str(root / "logs"),
        "save": str(save), "progress": False,
    })
    PPOTrainer(config).train()
    return data, save


def bad_checkpoints(folder: Path) -> dict[str, Path]:
    """A truncated checkpoint, an empty file, random bytes and a torch file that is no
    checkpoint, written into ``folder``."""
    folder.mkdir(exist_ok=True)
    whole = folder / "whole.pt"
    torch.save({"version": 2, "policy": {"w": torch.zeros(4096)}}, whole)
    files = {"truncated": whole.read_bytes()[:2000], "empty": b"",
             "garbage": random.Random(0).randbytes(3000)}
    for name, data in files.items():
        (folder / f"{name}.pt").write_bytes(data)
    torch.save({"state_dict": {"w": torch.zeros(2)}}, folder / "other.pt")
    whole.unlink()
    return {name: folder / f"{name}.pt" for name in (*files, "other")}


#: What each kind of bad file is called in its one line.
BAD_FILE_REASONS = {
    "truncated": "is truncated or damaged", "empty": "the file is empty",
    "garbage": "is not a file written by torch.save", "other": "a torch file holding a dict",
}


@contextlib.contextmanager
def example_module(name: str) -> Iterator[ModuleType]:
    """``examples/<name>.py`` loaded as a module, in process; the log handler it attaches to the
    ``esper_lightning`` logger is taken off again afterwards."""
    spec = importlib.util.spec_from_file_location(f"{name}_example",
                                                  ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    logger = logging.getLogger("esper_lightning")
    handlers, level = list(logger.handlers), logger.level
    yield module
    for handler in logger.handlers[len(handlers):]:  # the example attaches one: take it off
        logger.removeHandler(handler)
    logger.setLevel(level)


@contextlib.contextmanager
def script_module(name: str) -> Iterator[ModuleType]:
    """``scripts/<name>.py`` loaded as the module ``name``, registered in ``sys.modules`` while
    in use (dataclasses resolve their module by name) and taken out again afterwards."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]


@contextlib.contextmanager
def local_rendezvous() -> Iterator[None]:
    """A free port for this launch only: the environment is restored afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MASTER_ADDR", "127.0.0.1")
        patch.setenv("MASTER_PORT", str(port))
        yield
    assert not multiprocessing.active_children()  # the launcher joined every worker


# ---------------------------------------------------------------------------------- data


def epoch_batches(dm: L.LightningDataModule, epoch: int) -> list[Any]:
    """Every training batch of ``epoch``, with the sampler set as Lightning's fit loop does."""
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return list(loader)


def same_batches(a: Sequence[Sequence[torch.Tensor]], b: Sequence[Sequence[torch.Tensor]]) -> bool:
    """Whether two batch streams hold the same number of batches with equal tensors."""
    return len(a) == len(b) and all(
        torch.equal(x, y) for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True)
    )


def one_line_message(err: pytest.ExceptionInfo[BaseException]) -> str:
    """The raised error's message, checked to be a single line."""
    message = str(err.value)
    assert "\n" not in message
    return message


def scripted_step(env, action):
    """One step of a scripted stand-in for `MorphogenesisEnv`, as the real env takes it: execute
    the action, tick, observe (``env._observe()`` sets and returns ``env.observation``), count
    the decision and return the `Step` with its reward and episode end. ``env`` holds
    ``engine``, ``observation``, ``decisions``, ``episode_length`` and ``reward``."""
    from esper_lightning.envs import Step
    from esper_lightning.rl.episodes import is_terminal
    from esper_lightning.rl.rewards import compute_reward

    before = env.observation.report
    outcome = env.engine.execute(action)
    env.engine.tick()
    observation = env._observe()
    env.decisions += 1
    terminated = is_terminal(env.decisions, env.episode_length)
    reward = compute_reward(before, outcome.executed, observation.report, env.reward,
                            terminal=terminated)
    return Step(observation, reward, terminated, outcome)
