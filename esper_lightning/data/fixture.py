"""A tiny, learnable stand-in for CIFAR-10 written in the exact on-disk format.

Tests and smoke runs need data that goes through the real loading code, is small enough to write in
milliseconds and is learnable, so "accuracy rises above chance" is a meaningful check.
"""

from __future__ import annotations

import colorsys
import os
import pickle
from pathlib import Path

import numpy as np

from esper_lightning.data.cifar10 import (
    CIFAR10_CLASSES,
    FOLDER_NAME,
    TEST_FILES,
    TRAIN_FILES,
)

__all__ = ["write_cifar10_fixture"]

_NUM_CLASSES = len(CIFAR10_CLASSES)
_SIDE = 32
_PATTERN_AMPLITUDE = 40.0
_NOISE_STD = 24.0
# Protocol 2 is what the original Python 2 cPickle files use.
_PICKLE_PROTOCOL = 2


def _class_templates() -> np.ndarray:
    """One float ``[3, 32, 32]`` template per class: a distinct hue plus a striped pattern.

    The hue survives random crops and flips; the stripe orientation and frequency give a second,
    spatial cue so a CNN has something beyond the mean colour to pick up.
    """
    coords = np.arange(_SIDE, dtype=np.float64)
    templates = np.empty((_NUM_CLASSES, 3, _SIDE, _SIDE))
    for c in range(_NUM_CLASSES):
        rgb = np.array(colorsys.hsv_to_rgb(c / _NUM_CLASSES, 0.75, 0.8)) * 255.0
        wave = np.sin(2 * np.pi * (c // 2 + 1) * coords / _SIDE) * _PATTERN_AMPLITUDE
        stripes = wave[:, None] if c % 2 == 0 else wave[None, :]
        templates[c] = rgb[:, None, None] + np.broadcast_to(stripes, (_SIDE, _SIDE))
    return templates


def _sample(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    # Balanced labels (as in CIFAR-10), shuffled so every batch file mixes classes.
    labels = rng.permutation(np.arange(n) % _NUM_CLASSES)
    pixels = _class_templates()[labels] + rng.normal(0.0, _NOISE_STD, (n, 3, _SIDE, _SIDE))
    data = np.clip(np.rint(pixels), 0, 255).astype(np.uint8).reshape(n, -1)
    return data, [int(label) for label in labels]


def _write_batch(
    path: Path, data: np.ndarray, labels: list[int], batch_label: str, first_id: int
) -> None:
    filenames = [
        f"fixture_{first_id + i:05d}_{CIFAR10_CLASSES[label]}.png".encode()
        for i, label in enumerate(labels)
    ]
    batch = {
        b"batch_label": batch_label.encode(),
        b"labels": labels,
        b"data": np.ascontiguousarray(data),
        b"filenames": filenames,
    }
    with path.open("wb") as f:
        pickle.dump(batch, f, protocol=_PICKLE_PROTOCOL)


def _write_meta(folder: Path, per_batch: int) -> None:
    meta = {
        b"num_cases_per_batch": per_batch,
        b"label_names": [name.encode() for name in CIFAR10_CLASSES],
        b"num_vis": 3 * _SIDE * _SIDE,
    }
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump(meta, f, protocol=_PICKLE_PROTOCOL)


def write_cifar10_fixture(
    root: str | os.PathLike[str], n_train: int = 64, n_test: int = 32, rng_seed: int = 0
) -> Path:
    """Write a small synthetic CIFAR-10 in the standard ``cifar-10-batches-py`` pickle format.

    Each class has its own colour and stripe pattern plus Gaussian noise, so a tiny CNN beats
    chance within a couple of epochs. Training images are split across ``data_batch_1..5`` as
    evenly as possible; files carry the same keys as the real ones (``b"data"`` uint8
    ``[N, 3072]``, ``b"labels"``, ``b"batch_label"``, ``b"filenames"``) plus ``batches.meta``.

    Args:
        root: Folder to create ``cifar-10-batches-py/`` in (created if needed; existing fixture
            files are overwritten).
        n_train: Number of training images (at least 1).
        n_test: Number of test images (at least 1).
        rng_seed: Seed for the noise and label order; equal seeds write identical files.

    Returns:
        ``root`` as a ``Path``: the folder containing ``cifar-10-batches-py/``.

    Example:
        >>> import tempfile
        >>> from esper_lightning.data import load_cifar10
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = write_cifar10_fixture(tmp, n_train=80, n_test=40)
        ...     images, labels = load_cifar10(root, train=True)
        ...     images.shape, labels.bincount().tolist()  # balanced classes
        (torch.Size([80, 3, 32, 32]), [8, 8, 8, 8, 8, 8, 8, 8, 8, 8])
    """
    for name, value in (("n_train", n_train), ("n_test", n_test)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    root = Path(root).expanduser()
    folder = root / FOLDER_NAME
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(rng_seed)

    train_data, train_labels = _sample(n_train, rng)
    bounds = np.linspace(0, n_train, len(TRAIN_FILES) + 1).astype(int)
    for i, name in enumerate(TRAIN_FILES):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        label = f"training batch {i + 1} of {len(TRAIN_FILES)}"
        _write_batch(folder / name, train_data[lo:hi], train_labels[lo:hi], label, lo)

    test_data, test_labels = _sample(n_test, rng)
    _write_batch(folder / TEST_FILES[0], test_data, test_labels, "testing batch 1 of 1", n_train)
    _write_meta(folder, per_batch=int(np.max(np.diff(bounds))))
    return root
