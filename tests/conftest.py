"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from esper_lightning.data import write_cifar10_fixture


def pytest_configure(config: pytest.Config) -> None:
    # The test models are tiny: a second intra-op thread buys nothing, and on a busy 2-core
    # machine OpenMP spin-waiting between two processes slows them down by orders of magnitude.
    torch.set_num_threads(1)


@pytest.fixture
def cifar_dir(tmp_path: Path) -> Path:
    """A tiny learnable CIFAR-10 (80 train / 40 test) in the standard format; the folder that
    contains ``cifar-10-batches-py/``."""
    return write_cifar10_fixture(tmp_path / "cifar", n_train=80, n_test=40, rng_seed=0)
