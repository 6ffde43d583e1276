"""Tasks an env can play: the data a host trains on, the host that grows, how a batch is scored.

A `Task` holds everything about one learning problem that the env pool, the PPO trainer and the
comparison tool need, so none of them names a dataset or a host class:

* the data: `Task.load` reads the training and validation splits (downloading when asked);
* the host: `presets`, `slot_ids` and `make_host` (a `SlottedHost` with its own optimizer);
* the batches: `train_loader` (device-resident, reseeded per episode), `train_stream` (the
  batches of an episode under a compute budget, which has no epochs of data: an endless
  stream that repeats nothing within a pass over the data) and `validation_batches` (cut once
  per env, on its device); `corpus_size` and `batch_units` count what a run has seen
  (tokens or images) and `example_batch` is an input of a batch's shape (for FLOP counts);
* the score: `loss` of a training batch, and `num_classes` (classes, or the vocabulary) for the
  governor's lobotomy rule;
* the seeds: `topology`, hence the blueprints a controller may germinate (`blueprints`).

A task's facts live in its descriptor (``spec``, a `TaskSpec` of `envs.task_specs`: presets,
defaults, topology, capabilities), read as this class's attributes; the descriptor is
registered by name with the class that plays it (`register_task`), so a configuration checks a
task before torch loads and `task_class` finds the class when a run builds one. Two are
registered: ``"cifar"`` (`CifarTask`: `CifarCNNHost` on CIFAR-10 images) and ``"lm"``
(`TextTask`: `GPTHost` predicting the next byte of a text file).

Example:
    >>> task = TextTask(block_size=64, train_blocks=256, val_blocks=32)
    >>> train, val = task.load("shakespeare.txt")  # doctest: +SKIP
    >>> spec = EnvSpec(task=task, host_preset="tiny", slots=("r0c1",))  # doctest: +SKIP
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from esper_lightning import blueprints as blueprint_registry
from esper_lightning.data import (
    download_cifar10,
    download_tinystories,
    load_cifar10_subset,
)
from esper_lightning.data.cifar10 import cifar10_present
from esper_lightning.data.files import DataError, PathLike, check_int
from esper_lightning.data.locate import (
    HELD_OUT_FRACTION,
    check_val_fraction,
    find_text_file,
)
from esper_lightning.data.tensor_loader import TensorLoader, normalize
from esper_lightning.data.text import TextTensorLoader, load_text_splits, validation_blocks
from esper_lightning.envs.task_specs import CIFAR, LM, TaskSpec
from esper_lightning.hosts import CifarCNNHost, GPTHost
from esper_lightning.hosts.base import SlottedHost

__all__ = ["CifarTask", "Task", "TextTask", "TrainLoader"]

#: The descriptor's facts a `Task` class reads as its own class attributes.
DESCRIBED_FACTS = ("name", "topology", "num_classes", "presets", "default_preset", "default_slots",
              "default_host_lr", "example", "loss_in_bits")

#: Images per validation forward of the CIFAR task.
VAL_BATCH = 500
#: Blocks per validation forward of the language-model task (64 x 128 tokens x 256 logits).
VAL_BLOCKS = 64

Batch = tuple[Tensor, Tensor]


class TrainLoader(Protocol):
    """What an env needs of a training loader: epochs of ``(x, y)`` batches on its device, the
    number of batches per epoch, and a restart of its random stream per episode."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Batch]: ...

    def reseed(self, rng_seed: int) -> None: ...


class Task(ABC):
    """One learning problem for the env pool (see the module docstring).

    Class attributes:
        spec: the task's descriptor (`TaskSpec`), which a subclass sets; the attributes below
            are read from it when the subclass is defined (`DESCRIBED_FACTS`), never written twice.
        name: the task's name (``--task``).
        topology: the slots' topology, which picks the blueprints.
        num_classes: classes (or vocabulary size) of the targets.
        presets: host presets by name.
        default_preset, default_slots, default_host_lr: what a run uses when it names none.
        example: what one loss term is per, in reports (``"image"``, ``"byte"``).
        loss_in_bits: whether reports read the loss in bits (a language model's unit) too.
    """

    spec: ClassVar[TaskSpec]
    name: ClassVar[str]
    topology: ClassVar[str]
    num_classes: ClassVar[int]
    presets: ClassVar[Mapping[str, Any]]
    default_preset: ClassVar[str]
    default_slots: ClassVar[tuple[str, ...]]
    default_host_lr: ClassVar[float]
    example: ClassVar[str]
    loss_in_bits: ClassVar[bool]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is None:  # an abstract helper class, or a subclass keeping its parent's task
            return
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"{cls.__name__}.spec must be a TaskSpec, got {type(spec).__name__}")
        for fact in DESCRIBED_FACTS:
            setattr(cls, fact, getattr(spec, fact))

    @classmethod
    def slot_ids(cls, preset: str) -> tuple[str, ...]:
        """Every slot id of host ``preset``, in action order (the descriptor's)."""
        return cls.spec.slot_ids(preset)

    @abstractmethod
    def make_host(self, preset: str, slots: Sequence[str], lr: float) -> SlottedHost:
        """A fresh host (drawn from the global generator) with only ``slots`` enabled."""

    @abstractmethod
    def load(self, data_dir: PathLike | None, *, download: bool = False, progress: bool = True,
             rng_seed: int = 0) -> tuple[Any, Any]:
        """The training and validation data, on the CPU (each env copies them to its device)."""

    @abstractmethod
    def load_test(self, data_dir: PathLike | None, *, rng_seed: int = 0) -> Any:
        """The test split, on the CPU: read only for final tables (`validation_batches` cuts it
        into batches like the validation data)."""

    @abstractmethod
    def train_loader(self, train: Any, batch_size: int, device: torch.device) -> TrainLoader:
        """A loader of training batches on ``device``."""

    @abstractmethod
    def validation_batches(self, val: Any, device: torch.device) -> list[Batch]:
        """The validation set as ``(x, y)`` batches on ``device``, always the same."""

    @abstractmethod
    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """Mean training loss of a batch."""

    @abstractmethod
    def corpus_size(self, train: Any) -> int:
        """Units of the training data (tokens, images) that `batch_units` counts."""

    @abstractmethod
    def batch_units(self, x: Tensor) -> int:
        """Units of training data in the input batch ``x``."""

    @abstractmethod
    def example_batch(self, batch_size: int) -> Tensor:
        """A meta tensor shaped like the inputs of a training batch."""

    def train_stream(self, loader: TrainLoader) -> Iterator[Batch]:
        """Endless training batches for an episode measured in FLOPs, not epochs: the
        loader's epochs back to back (each a fresh permutation without replacement)."""
        while True:
            yield from loader

    @classmethod
    @abstractmethod
    def configured(cls, *, host_preset: str, train_subset: int | None,
                   val_subset: int | None, block_size: int | None) -> Task:
        """The task with a run's data settings (``--task`` picks the class, `task_class`, this
        builds it): each task takes the settings it has and ignores the others. ``host_preset``
        is the run's host (a language model's block size defaults to its preset's)."""

    @classmethod
    def blueprints(cls) -> tuple[str, ...]:
        """Blueprints a controller may germinate in this task's slots, smallest first."""
        return blueprint_registry.available(cls.topology)

    @classmethod
    def check_preset(cls, preset: str) -> None:
        """A one-line `ValueError` when ``preset`` is not a host preset of this task."""
        cls.spec.check_preset(preset)

    def check_train_split(self, train: Any, batch_size: int) -> None:
        """Refuse training data of which an epoch holds no batch of ``batch_size`` (a loader
        drops its last short batch, so the run would train on nothing). Reads the task's own
        loader, built on the CPU where `load` left the data.

        Raises:
            DataError: such data, in one line (also what the loader itself refuses).
        """
        try:
            batches = len(self.train_loader(train, batch_size, torch.device("cpu")))
        except ValueError as err:  # a loader that refuses a split too small itself
            raise DataError(f"the training split gives an epoch no batch: {err}") from None
        if batches == 0:
            raise DataError(f"the training split holds {self.corpus_size(train)} "
                            f"{self.example}s, fewer than batch_size={batch_size}: an epoch "
                            "would train on no batch; lower batch_size or use more data")


@dataclass(frozen=True)
class CifarTask(Task):
    """CIFAR-10 classification with `CifarCNNHost` (random crops and flips while training).

    Validation is the first half of the official test batch, the test split its second half
    (`data.cifar10.held_out_half`): decisions never read the test images.

    Args:
        train_subset: at most this many training images (None: all).
        val_subset: at most this many validation images (None: all of the validation half).

    Example:
        >>> train, val = CifarTask(train_subset=5000).load("data")  # doctest: +SKIP
    """

    spec: ClassVar[TaskSpec] = CIFAR

    train_subset: int | None = None
    val_subset: int | None = None

    @classmethod
    def configured(cls, *, host_preset: str, train_subset: int | None,
                   val_subset: int | None, block_size: int | None) -> CifarTask:
        return cls(train_subset=train_subset, val_subset=val_subset)

    def make_host(self, preset: str, slots: Sequence[str], lr: float) -> SlottedHost:
        return CifarCNNHost(preset, slots=slots, lr=lr)

    def load(self, data_dir: PathLike | None, *, download: bool = False, progress: bool = True,
             rng_seed: int = 0) -> tuple[Batch, Batch]:
        """uint8 images ``[N, 3, 32, 32]`` and int64 labels of each split; the subsets are
        drawn from ``rng_seed``."""
        if download and not cifar10_present(data_dir):
            download_cifar10(data_dir, progress=progress)
        train = load_cifar10_subset(data_dir, "train", self.train_subset, rng_seed,
                                    at_most=True)
        val = load_cifar10_subset(data_dir, "validation", self.val_subset, rng_seed,
                                  at_most=True)
        return train, val

    def load_test(self, data_dir: PathLike | None, *, rng_seed: int = 0) -> Batch:
        """The test half of the official test batch, whole."""
        return load_cifar10_subset(data_dir, "test")

    def train_loader(self, train: Batch, batch_size: int, device: torch.device) -> TrainLoader:
        return TensorLoader(*train, batch_size, device=device, drop_last=True)

    def validation_batches(self, val: Batch, device: torch.device) -> list[Batch]:
        x = normalize(val[0].to(device))  # normalised once: [N, 3, 32, 32]
        y = val[1].to(device)
        return [(x[i:i + VAL_BATCH], y[i:i + VAL_BATCH]) for i in range(0, len(y), VAL_BATCH)]

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits, y)  # [B, 10] logits, [B] labels

    def corpus_size(self, train: Batch) -> int:
        return len(train[1])  # images

    def batch_units(self, x: Tensor) -> int:
        return int(x.shape[0])

    def example_batch(self, batch_size: int) -> Tensor:
        return torch.empty(batch_size, 3, 32, 32, device="meta")


@dataclass(frozen=True)
class TextTask(Task):
    """Next-byte prediction on a text file with `GPTHost` (vocabulary 256).

    The file's bytes split into a training head, a validation and a test split (`split_text`).
    Training batches are blocks at random offsets of the head (`TextTensorLoader`); validation
    is non-overlapping blocks of the validation split, spread over all of it. Loss and accuracy
    count every token.

    Args:
        block_size: tokens per block ``T`` (at most the GPT preset's ``block_size``).
        train_blocks: blocks per training epoch (None: about one pass over the head).
        val_blocks: at most this many validation blocks, evenly spread (None: the whole split).
        val_fraction: share of the file held out at its end (validation and test splits).

    Example:
        >>> task = TextTask(block_size=64, train_blocks=512, val_blocks=32)
        >>> train, val = task.load("shakespeare.txt")  # doctest: +SKIP
    """

    spec: ClassVar[TaskSpec] = LM  # UTF-8 bytes are the tokens (its example is "byte")

    block_size: int = 128
    train_blocks: int | None = None
    val_blocks: int | None = None
    val_fraction: float = HELD_OUT_FRACTION

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, 1)
        check_int("train_blocks", self.train_blocks, 1, allow_none=True)
        check_int("val_blocks", self.val_blocks, 1, allow_none=True)
        check_val_fraction(self.val_fraction)

    @classmethod
    def configured(cls, *, host_preset: str, train_subset: int | None,
                   val_subset: int | None, block_size: int | None) -> TextTask:
        """Blocks of ``block_size`` tokens (None: the GPT preset's), ``train_subset`` training
        blocks per epoch and ``val_subset`` validation blocks."""
        block_size = cls.spec.run_block_size(host_preset, block_size)
        return cls(block_size=block_size, train_blocks=train_subset, val_blocks=val_subset)

    def make_host(self, preset: str, slots: Sequence[str], lr: float) -> SlottedHost:
        limit = self.spec.block_limit(preset)  # checks the preset's name too
        if self.block_size > limit:
            raise ValueError(f"block_size {self.block_size} exceeds the {preset!r} host's "
                             f"block_size {limit}; accepted: 1..{limit}")
        return GPTHost(preset, slots=slots, lr=lr)

    def load(self, data_dir: PathLike | None, *, download: bool = False, progress: bool = True,
             rng_seed: int = 0) -> tuple[Tensor, Tensor]:
        """uint8 tokens ``[N]`` of the training head and the validation split. ``data_dir`` is a
        text file or a folder holding one (`find_text_file`); with ``download`` and no file
        there, the TinyStories validation split is downloaded into the folder. The split is
        contiguous, so ``rng_seed`` plays no part."""
        if download and not (data_dir is not None and Path(data_dir).expanduser().is_file()):
            file = download_tinystories(data_dir, progress=progress)
        else:
            file = find_text_file(data_dir)
        parts = load_text_splits(file, self.block_size, self.val_fraction)  # one-line DataError
        return parts.train, parts.validation

    def load_test(self, data_dir: PathLike | None, *, rng_seed: int = 0) -> Tensor:
        """uint8 tokens of the test split (`split_text`)."""
        file = find_text_file(data_dir)
        return load_text_splits(file, self.block_size, self.val_fraction).test

    def train_loader(self, train: Tensor, batch_size: int, device: torch.device) -> TrainLoader:
        return TextTensorLoader(train, self.block_size, batch_size, n_blocks=self.train_blocks,
                                device=device)

    def validation_batches(self, val: Tensor, device: torch.device) -> list[Batch]:
        x, y = validation_blocks(val, self.block_size, self.val_blocks, device)  # [N, T] each
        return [(x[i:i + VAL_BLOCKS], y[i:i + VAL_BLOCKS]) for i in range(0, len(y), VAL_BLOCKS)]

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())  # every token of [B, T]

    def corpus_size(self, train: Tensor) -> int:
        return len(train)  # tokens

    def batch_units(self, x: Tensor) -> int:
        return int(x.numel())

    def example_batch(self, batch_size: int) -> Tensor:
        return torch.empty(batch_size, self.block_size, dtype=torch.long, device="meta")

    def train_stream(self, loader: TrainLoader) -> Iterator[Batch]:
        """Non-overlapping blocks without replacement, from a random offset per pass
        (`TextTensorLoader.stream`): within a pass no token is trained on twice."""
        if not isinstance(loader, TextTensorLoader):
            raise TypeError(f"the lm task streams a TextTensorLoader, got {type(loader).__name__}")
        return loader.stream()

