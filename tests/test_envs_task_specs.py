"""Tasks that describe themselves (`envs.task_specs`): the built-in descriptors, the registry's
one-line refusals, and a third task defined here, outside the package, in one module and one
registration: configured, checked, played for an env episode and compared through the lab."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from esper_lightning.app.cli import check_paths
from esper_lightning.app.compare.api import compare
from esper_lightning.app.config import CompareConfig, TaskConfig
from esper_lightning.app.task import env_spec, load_splits, make_task
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.lifecycle import SeedStage
from esper_lightning.data import DataError
from esper_lightning.envs import EnvPool
from esper_lightning.envs.task_specs import (
    CIFAR,
    LM,
    TASKS,
    TaskSpec,
    refuse_data_dir,
    register_task,
    task_class,
    task_names,
    task_spec,
    unregister_task,
)
from esper_lightning.envs.tasks import CifarTask, Task, TextTask
from esper_lightning.errors import ConfigError
from esper_lightning.hosts import GPTHost
from esper_lightning.hosts.presets import GPT_PRESETS

CPU = torch.device("cpu")


# --- a third task: counting sequences, defined outside the package ---------------------------
#: Symbols of a sequence (its tokens are bytes of the GPT host's 256-entry vocabulary).
SYMBOLS = 16
SEQ = TaskSpec(
    name="seq", topology="transformer", num_classes=256,
    presets={name: GPT_PRESETS[name] for name in ("w32l1", "grow2")}, default_preset="w32l1",
    default_slots=("r0c0",), default_host_lr=3e-3, check_data=refuse_data_dir("seq"),
    example="token", takes_block_size=True, grows_depth=True,
)


def counting_blocks(n: int, length: int, rng_seed: int) -> Tensor:
    """``n`` sequences ``(start + stride * t) mod SYMBOLS`` of ``length`` tokens, int64
    ``[n, length]``, a random start and a stride in 1..3 per sequence."""
    generator = torch.Generator().manual_seed(rng_seed)
    start = torch.randint(0, SYMBOLS, (n, 1), generator=generator)
    stride = torch.randint(1, 4, (n, 1), generator=generator)
    return (start + stride * torch.arange(length)) % SYMBOLS


class BlockLoader:
    """Epochs of ``(x, y)`` batches of whole sequences, ``y`` = ``x`` shifted by one."""

    def __init__(self, blocks: Tensor, batch_size: int, device: torch.device) -> None:
        self.blocks, self.batch_size = blocks.to(device), batch_size  # [N, T + 1]
        self.generator = torch.Generator(device=device)

    def __len__(self) -> int:
        return len(self.blocks) // self.batch_size

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        n = len(self) * self.batch_size
        order = torch.randperm(len(self.blocks), generator=self.generator,
                               device=self.blocks.device)[:n].view(len(self), self.batch_size)
        for rows in order:
            yield self.blocks[rows, :-1], self.blocks[rows, 1:]

    def reseed(self, rng_seed: int) -> None:
        self.generator.manual_seed(rng_seed)


@dataclass(frozen=True)
class SeqTask(Task):
    """Predict the next token of a counting sequence (its stride read from the context)."""

    spec: ClassVar[TaskSpec] = SEQ
    block_size: int = 16
    train_blocks: int = 64
    val_blocks: int = 16

    @classmethod
    def configured(cls, *, host_preset: str, train_subset: int | None,
                   val_subset: int | None, block_size: int | None) -> SeqTask:
        return cls(block_size or cls.spec.block_limit(host_preset) or 16,
                   train_subset or 64, val_subset or 16)

    def make_host(self, preset: str, slots: Any, lr: float) -> GPTHost:
        self.check_preset(preset)
        return GPTHost(preset, slots=slots, lr=lr)

    def load(self, data_dir: Any, *, download: bool = False, progress: bool = True,
             rng_seed: int = 0) -> tuple[Tensor, Tensor]:
        return (counting_blocks(self.train_blocks, self.block_size + 1, rng_seed),
                counting_blocks(self.val_blocks, self.block_size + 1, rng_seed + 1))

    def load_test(self, data_dir: Any, *, rng_seed: int = 0) -> Tensor:
        return counting_blocks(self.val_blocks, self.block_size + 1, rng_seed + 2)

    def train_loader(self, train: Tensor, batch_size: int, device: torch.device) -> BlockLoader:
        return BlockLoader(train, batch_size, device)

    def validation_batches(self, val: Tensor, device: torch.device) -> list[tuple[Tensor, Tensor]]:
        val = val.to(device)
        return [(val[:, :-1], val[:, 1:])]

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    def corpus_size(self, train: Tensor) -> int:
        return train[:, 1:].numel()  # targets

    def batch_units(self, x: Tensor) -> int:
        return int(x.numel())

    def example_batch(self, batch_size: int) -> Tensor:
        return torch.empty(batch_size, self.block_size, dtype=torch.long, device="meta")


@pytest.fixture
def seq_task() -> Iterator[TaskSpec]:
    """The third task registered (the one registration a new task needs), removed after."""
    register_task(SEQ, SeqTask)
    try:
        yield SEQ
    finally:
        unregister_task("seq")


# --- the built-in descriptors ----------------------------------------------------------------
def test_built_in_tasks_describe_themselves_and_their_classes_read_it():
    assert task_names()[:2] == ("cifar", "lm") and TASKS["lm"] is LM is task_spec("lm")
    assert task_class("cifar") is CifarTask and task_class("lm") is TextTask
    for cls in (CifarTask, TextTask):  # the class's facts are its descriptor's, not a copy
        assert cls.presets is cls.spec.presets
        assert (cls.name, cls.topology, cls.num_classes, cls.default_slots, cls.example) == (
            cls.spec.name, cls.spec.topology, cls.spec.num_classes, cls.spec.default_slots,
            cls.spec.example)
        for preset in cls.presets:
            assert cls.slot_ids(preset) == cls.spec.slot_ids(preset)
    assert (LM.takes_block_size, LM.grows_depth, LM.subset_per_epoch) == (True, True, True)
    assert (CIFAR.takes_block_size, CIFAR.grows_depth, CIFAR.subset_per_epoch) == (
        False, False, False)
    assert LM.block_limit("grow4") == 32 and CIFAR.block_limit("baseline") is None
    assert LM.growth_slot_ids("grow124") == ("r1c0", "r1c1") and LM.growth_slot_ids("tiny") == ()
    assert CIFAR.growing_host("baseline") is None and LM.growing_host("grow4").max_depth == 4
    assert LM.defaults() == {"host_preset": "tiny", "slots": ("r0c0", "r0c1"), "host_lr": 1e-3}


def test_the_built_in_data_checks_are_one_line(tmp_path):
    with pytest.raises(DataError, match=f"CIFAR-10 not found in '{tmp_path}'"):
        CIFAR.check_data(str(tmp_path), None)
    with pytest.raises(DataError, match=r"holds no \*\.txt file"):
        LM.check_data(str(tmp_path), 8)
    (tmp_path / "plays.txt").write_text("to be or not to be" * 10)  # 180 bytes: 162, 9, 9
    LM.check_data(str(tmp_path / "plays.txt"), 8)  # found, and each part holds a block of 8
    with pytest.raises(DataError, match="block_size=9: its validation split holds 9 of its 180"):
        LM.check_data(str(tmp_path / "plays.txt"), 9)


def test_the_run_block_size_is_the_given_or_the_presets():
    assert LM.run_block_size("grow4", 8) == 8 and LM.run_block_size("grow4", None) == 32
    assert CIFAR.run_block_size("baseline", None) is None


def test_the_registry_refuses_in_one_line():
    with pytest.raises(ValueError, match="unknown task 'audio'; accepted: cifar, lm"):
        task_spec("audio")
    with pytest.raises(ValueError, match="task 'lm' is already registered; accepted: a new "):
        register_task(LM, TextTask)
    with pytest.raises(ValueError, match=r"task path 'tasks\.SeqTask' of 'seq' is not 'module:"):
        register_task(SEQ, "tasks.SeqTask")
    with pytest.raises(ValueError, match="neither a Task class nor"):
        register_task(SEQ, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="register_task takes a TaskSpec, got dict"):
        register_task({"name": "seq"}, SeqTask)  # type: ignore[arg-type]
    assert "seq" not in TASKS  # nothing half-registered


def test_a_descriptor_is_checked_when_it_is_made():
    with pytest.raises(ValueError, match="unknown host_preset 'big' for task 'seq'; accepted: "
                                         "w32l1, grow2"):
        dataclasses.replace(SEQ, default_preset="big")
    with pytest.raises(ValueError, match=r"default_slots \('r5c0',\) are not slots of preset "
                                         r"'w32l1'; accepted: r0c0"):
        dataclasses.replace(SEQ, default_slots=("r5c0",))
    with pytest.raises(ValueError, match="has grows_depth but preset 'baseline' has no n_layer"):
        dataclasses.replace(CIFAR, name="deep", grows_depth=True)
    with pytest.raises(ValueError, match="has takes_block_size but preset 'baseline' has no "
                                         "block_size"):
        dataclasses.replace(CIFAR, name="long", takes_block_size=True)
    with pytest.raises(ValueError, match="name must be an identifier such as 'lm', got 'a b'"):
        dataclasses.replace(SEQ, name="a b")
    with pytest.raises(ValueError, match="num_classes must be an int >= 1, got 0"):
        dataclasses.replace(SEQ, num_classes=0)


def test_a_class_must_carry_the_descriptor_it_is_registered_with():
    other = dataclasses.replace(SEQ, name="other")
    register_task(other, SeqTask)  # SeqTask's spec is SEQ, not this one
    try:
        with pytest.raises(ValueError, match="SeqTask plays task 'other' but its spec is not "
                                             "the registered one"):
            task_class("other")
    finally:
        unregister_task("other")
    with pytest.raises(TypeError, match=r"Bad\.spec must be a TaskSpec, got str"):
        type("Bad", (SeqTask,), {"spec": "seq"})


# --- the third task, from outside the package ------------------------------------------------
def test_a_registered_task_is_configured_from_its_descriptor(seq_task, tmp_path):
    config = TaskConfig(task="seq", episode_length=3, batch_size=8)
    assert (config.host_preset, config.slots, config.host_lr) == ("w32l1", ("r0c0",), 3e-3)
    assert make_task(config) == SeqTask(block_size=32, train_blocks=64, val_blocks=16)
    assert make_task(config.replace(block_size=8)).block_size == 8  # it takes block_size
    with pytest.raises(ConfigError, match="block_size must be in \\[1, 32\\] for host_preset "
                                          "'w32l1', got 64"):
        config.replace(block_size=64)
    with pytest.raises(ConfigError, match="unknown host_preset 'tiny' for task 'seq'"):
        config.replace(host_preset="tiny")
    moved = TaskConfig(task="lm").replace(task="seq")  # the lm defaults follow the task
    assert (moved.host_preset, moved.slots) == ("w32l1", ("r0c0",))
    check_paths(config)  # no data to find: its check accepts a null data_dir
    with pytest.raises(DataError, match="task 'seq' makes its own data, got data_dir="):
        check_paths(config.replace(data_dir=str(tmp_path)))
    with pytest.raises(DataError, match="the training split holds 112 tokens, fewer than "
                                        "batch_size=8"):
        load_splits(config.replace(train_subset=7, block_size=16))


def test_the_third_task_plays_an_env_episode(seq_task):
    config = TaskConfig(task="seq", host_preset="w32l1", block_size=16, episode_length=4,
                        batch_size=8, min_training_epochs=1, rng_seed=5)
    spec = env_spec(config)
    assert isinstance(spec.task, SeqTask) and spec.governor.num_classes == 256
    runs = []
    for _ in range(2):  # the same episode twice: the same numbers
        pool = EnvPool(spec, *load_splits(config), ["cpu"])
        observations = pool.reset([3])
        script = [Action(LifecycleOp.GERMINATE, 0, blueprint="lora"), Action(), Action()]
        observations += [pool.step([action])[0].observation for action in script]
        runs.append([o.report.val_loss for o in observations])
        env = pool.envs[0]
        assert env.engine.topology == "transformer"
        assert env.engine.slots["r0c0"].stage is not SeedStage.DORMANT
    assert runs[0] == runs[1]
    assert runs[0][-1] < runs[0][0] < 6.0  # it learns the counting: the loss falls


def test_the_third_task_compares_a_growing_arm_through_the_lab(seq_task, tmp_path):
    result = compare(
        ["static", "stack:2@0.34:identity"], task="seq", host_preset="grow2", slots=["r1c0"],
        block_size=16, episode_length=3, batch_size=8, min_training_epochs=1, envs=1, seeds=1,
        out=str(tmp_path / "cmp"), progress=False)
    assert isinstance(result.config, CompareConfig) and result.config.task == "seq"
    table = result.table.set_index("controller")
    assert sorted(table.index) == ["stack:2@0.34:identity", "static"]
    # The stack arm read the host's growth slots from the descriptor and grew in r1c0.
    assert table.loc["stack:2@0.34:identity", "seeds_germinated"] == 1
    assert table.loc["static", "seeds_germinated"] == 0
    assert table.loc["stack:2@0.34:identity", "seed_params"] > 0
