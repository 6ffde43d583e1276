"""Test helpers shared by several test files: tiny models, a checkpoint round trip, a trained
smoke policy, files that are no checkpoint, the example loader, a command run as its own process
would run it, a local DDP rendezvous and the data tests' batch and message checks.

Imported as ``from helpers import ...``: pytest puts ``tests/`` (not a package) on ``sys.path``,
as for ``thread_ranks`` and ``lifecycle_mdp``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import multiprocessing
import os
import random
import runpy
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import numpy as np
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



#: The README's quickstart, ``examples/cifar_ppo.py --preset smoke``, shortened to one round of
#: 3-epoch episodes (CI runs it whole); each run adds its data, log and checkpoint paths.
QUICKSTART = ["--preset", "smoke", "--rounds", "1", "--episode-length", "3", "--no-progress"]


def train_smoke_policy(root: Path) -> tuple[Path, Path]:
    """The README's quickstart as `QUICKSTART` shortens it, run as its own process would run it
    (`as_a_process`) on a fixture in ``root``: a one-round PPO policy (``smoke`` preset,
    episodes of 3 epochs); returns ``(data folder, checkpoint)``, its logs in ``root/logs``. A
    failed run fails the test that asked for it, with the run's stderr."""
    from esper_lightning.data import write_cifar10_fixture

    data = write_cifar10_fixture(root / "data", n_train=64, n_test=32)
    save = root / "ckpt.pt"
    argv = [*QUICKSTART, "--data-dir", str(data), "--logdir", str(root / "logs"),
            "--save", str(save)]
    done = as_a_process(run_script(ROOT / "examples" / "cifar_ppo.py"), argv)
    assert done.returncode == 0, done.stderr
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


#: The warning filters a Python interpreter starts with (no ``-W``, not ``-X dev``): what a
#: command run in a fresh process shows on stderr, where pytest would record it instead.
STARTUP_WARNING_FILTERS = [("default", DeprecationWarning, "__main__"),
                           ("ignore", DeprecationWarning, ""),
                           ("ignore", PendingDeprecationWarning, ""),
                           ("ignore", ImportWarning, ""), ("ignore", ResourceWarning, "")]


def _show_on_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    """`warnings.showwarning` as the interpreter's own: the formatted warning on stderr."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def run_script(path: Path) -> Callable[[list[str]], int]:
    """A command that runs the script at ``path`` as ``python PATH ARGV`` does (``__main__``,
    ``sys.argv``), for `as_a_process`; its status is its `SystemExit`'s."""
    def command(argv: list[str]) -> int:
        sys.argv[0] = str(path)  # as_a_process puts sys.argv back
        runpy.run_path(str(path), run_name="__main__")
        return 0
    return command


def as_a_process(command: Callable[[list[str]], int], argv: Sequence[str]
                 ) -> subprocess.CompletedProcess[str]:
    """``command(argv)`` (`esper_lightning.app.cli.main`, an example's ``main``, `run_script`)
    in this process, seen as a fresh process of its own would be seen: ``sys.argv[1:]`` is
    ``argv``; its status (a `SystemExit`'s code included), stdout and stderr, with warnings
    shown on stderr under the interpreter's start-up filters (not recorded by pytest) and the
    package's logger without handlers. It costs no import of torch and Lightning, which a
    launch pays again each time (seconds); the launches of tests/test_app_cli.py and
    tests/test_app_startup.py keep the console command itself honest. ``sys.argv``, the
    logger, the warning filters, the environment (a fit's ``PL_GLOBAL_SEED``), Python's,
    NumPy's and torch's generators and torch's thread count are put back afterwards, as a
    process's end would leave them."""
    logger = logging.getLogger("esper_lightning")
    handlers, level, threads = list(logger.handlers), logger.level, torch.get_num_threads()
    environ, python_rng, numpy_rng = dict(os.environ), random.getstate(), np.random.get_state()
    program = sys.argv
    sys.argv = [program[0], *argv]
    out, err = io.StringIO(), io.StringIO()
    with (warnings.catch_warnings(), torch.random.fork_rng(), contextlib.redirect_stdout(out),
          contextlib.redirect_stderr(err)):
        warnings.resetwarnings()
        for action, category, module in STARTUP_WARNING_FILTERS:
            warnings.filterwarnings(action, category=category, module=module, append=True)
        warnings.showwarning = _show_on_stderr
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        try:
            status = command(list(argv))
        except SystemExit as done:
            if isinstance(done.code, str):  # the interpreter prints the message, status 1
                print(done.code, file=sys.stderr)
            status = done.code if isinstance(done.code, int) else int(done.code is not None)
        finally:
            sys.argv = program
            logger.handlers[:] = handlers
            logger.setLevel(level)
            torch.set_num_threads(threads)
            os.environ.clear()
            os.environ.update(environ)
            random.setstate(python_rng)
            np.random.set_state(numpy_rng)
    return subprocess.CompletedProcess(list(argv), status, out.getvalue(), err.getvalue())


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
