"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from esper_lightning.data import write_cifar10_fixture


@pytest.fixture
def cifar_dir(tmp_path: Path) -> Path:
    """A tiny learnable CIFAR-10 (80 train / 40 test) in the standard format; the folder that
    contains ``cifar-10-batches-py/``."""
    return write_cifar10_fixture(tmp_path / "cifar", n_train=80, n_test=40, seed=0)
