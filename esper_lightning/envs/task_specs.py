"""Tasks that describe themselves: each task's facts as plain data, registered once by name.

A `TaskSpec` is what a configuration, the command line and the comparison tool know of a task
without importing torch: its host presets and slot ids, what a run that names none uses, its
capabilities (``takes_block_size``, ``grows_depth``, ``subset_per_epoch``) and its data-path
check. The `Task` class that plays it (`envs.tasks`) reads the same descriptor (its ``spec``),
so no fact is written twice, and nothing outside the task asks which task it is.

`register_task` files a descriptor under its name beside the class that plays it, a class or
its ``"module:Class"`` path imported on first use (`task_class`): the two built-in tasks,
``cifar`` and ``lm``, are registered here by path, so this module and every caller of it stay
free of torch. A task of your own is one module and one registration::

    SEQ = TaskSpec(name="seq", topology="transformer", num_classes=16,
                   presets=GPT_PRESETS, default_preset="tiny", default_slots=("r0c0",),
                   default_host_lr=1e-3, check_data=refuse_data_dir("seq"))

    class SeqTask(Task):
        spec = SEQ
        ...

    register_task(SEQ, SeqTask)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from esper_lightning.data.files import DataError, resolve_data_dir
from esper_lightning.data.locate import (
    check_text_size,
    cifar10_not_found,
    find_batches_dir,
    find_text_file,
)
from esper_lightning.hosts.presets import GPT_PRESETS, PRESETS

__all__ = [
    "CIFAR",
    "LM",
    "TASKS",
    "DataCheck",
    "TaskSpec",
    "refuse_data_dir",
    "register_task",
    "task_class",
    "task_names",
    "task_spec",
    "unregister_task",
]

#: A task's data check, ``check(data_dir, block_size)``: a one-line `DataError` (or
#: `ConfigError`) when ``data_dir`` holds no data the task reads, or too little for one block of
#: ``block_size`` tokens (None for a task without blocks); plain Python, so the command line runs
#: it before torch loads.
DataCheck = Callable[[str | None, int | None], None]


@dataclass(frozen=True)
class TaskSpec:
    """One task's facts as plain data (the module docstring shows a whole registration).

    Args:
        name: the task's name (``--task``), unique among the registered tasks.
        topology: the slots' topology, which picks the blueprints a controller may germinate.
        num_classes: classes (or vocabulary size) of the targets; also the governor's
            lobotomy rule.
        presets: host presets by name (plain data: each has ``slot_ids``).
        default_preset: the host preset of a run that names none.
        default_slots: the enabled slots of a run that names none.
        default_host_lr: the host learning rate of a run that names none.
        check_data: the data-path check (`DataCheck`) the command line runs before torch.
        example: what one loss term is per, in reports (``"image"``, ``"byte"``).
        loss_in_bits: whether reports read the loss in bits (a language model's unit) too.
        takes_block_size: whether a run sets tokens per block (``--block_size``, at most the
            preset's ``block_size``); a task without it refuses one.
        grows_depth: whether its presets are stacks of blocks with growth slots (each has
            ``n_layer``, ``growth_slot_ids``, ``growth_depths``, ``max_depth``), which the
            comparison's ``stack:`` and ``born:`` arms and the growth heuristic read.
        subset_per_epoch: whether ``train_subset`` sets an epoch's training batches (blocks
            per epoch, at least one batch) rather than a subset of the data; a compute budget
            sets an epoch's batches instead, so the two are refused together.
    """

    name: str
    topology: str
    num_classes: int
    presets: Mapping[str, Any]
    default_preset: str
    default_slots: tuple[str, ...]
    default_host_lr: float
    check_data: DataCheck
    example: str = "example"
    loss_in_bits: bool = False
    takes_block_size: bool = False
    grows_depth: bool = False
    subset_per_epoch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"TaskSpec name must be an identifier such as 'lm', got "
                             f"{self.name!r}")
        if isinstance(self.num_classes, bool) or not (
                isinstance(self.num_classes, int) and self.num_classes >= 1):
            raise ValueError(f"TaskSpec {self.name!r}: num_classes must be an int >= 1, got "
                             f"{self.num_classes!r}")
        if not self.default_host_lr > 0:
            raise ValueError(f"TaskSpec {self.name!r}: default_host_lr must be > 0, got "
                             f"{self.default_host_lr!r}")
        accepted = self.slot_ids(self.default_preset)  # also checks the preset's name
        stray = [s for s in self.default_slots if s not in accepted]
        if not self.default_slots or stray:
            raise ValueError(f"TaskSpec {self.name!r}: default_slots {self.default_slots!r} are "
                             f"not slots of preset {self.default_preset!r}; accepted: "
                             f"{', '.join(accepted)}")
        self._check_capabilities()

    def _check_capabilities(self) -> None:
        """Each capability's presets carry what its readers take from them."""
        needs = {"takes_block_size": ("block_size",),
                 "grows_depth": ("n_layer", "growth_slot_ids", "growth_depths", "max_depth")}
        for capability, names in needs.items():
            if not getattr(self, capability):
                continue
            for preset, shape in self.presets.items():
                missing = [n for n in names if not hasattr(shape, n)]
                if missing:
                    raise ValueError(f"TaskSpec {self.name!r} has {capability} but preset "
                                     f"{preset!r} has no {', '.join(missing)}")

    def check_preset(self, preset: str) -> None:
        """A one-line `ValueError` when ``preset`` is not a host preset of this task."""
        if preset not in self.presets:
            raise ValueError(f"unknown host_preset {preset!r} for task {self.name!r}; accepted: "
                             f"{', '.join(self.presets)}")

    def slot_ids(self, preset: str) -> tuple[str, ...]:
        """Every slot id of host ``preset``, in action order (growth slots included)."""
        self.check_preset(preset)
        return tuple(self.presets[preset].slot_ids)

    def block_limit(self, preset: str) -> int | None:
        """The longest block host ``preset`` takes (None: the task takes no block size)."""
        if not self.takes_block_size:
            return None
        self.check_preset(preset)
        return int(self.presets[preset].block_size)

    def run_block_size(self, preset: str, block_size: int | None) -> int | None:
        """Tokens per block of a run on host ``preset`` that asks for ``block_size`` (None: the
        preset's; and None for a task that takes no block size)."""
        return block_size or self.block_limit(preset)

    def growing_host(self, preset: str) -> Any | None:
        """The shape of host ``preset`` as a stack that grows deeper (None: a task whose hosts
        do not grow depth, or an unknown preset; the arms that need one refuse it in one
        line)."""
        return self.presets.get(preset) if self.grows_depth else None

    def growth_slot_ids(self, preset: str) -> tuple[str, ...]:
        """The growth slots of host ``preset`` (empty: a host that does not grow deeper)."""
        host = self.growing_host(preset)
        return tuple(host.growth_slot_ids) if host is not None else ()

    def defaults(self) -> dict[str, Any]:
        """The values a configuration's task-defaulted keys take when it names none."""
        return {"host_preset": self.default_preset, "slots": self.default_slots,
                "host_lr": self.default_host_lr}


#: Each registered task's descriptor by name, and what plays it (`register_task`).
_DESCRIPTORS: dict[str, TaskSpec] = {}
_PLAYERS: dict[str, str | type] = {}
#: The registered descriptors by name: a read-only live view (`register_task` adds one).
TASKS: Mapping[str, TaskSpec] = MappingProxyType(_DESCRIPTORS)


def register_task(spec: TaskSpec, task: str | type, *, replace: bool = False) -> TaskSpec:
    """File ``spec`` under its name, played by ``task``: a `Task` subclass whose ``spec`` is
    this one, or its ``"module:Class"`` path (imported on first use, so a descriptor registered
    by path costs no torch). Returns ``spec``.

    Raises:
        ValueError: a name already registered (unless ``replace``), or a ``task`` that is
            neither a class nor a ``"module:Class"`` path.
    """
    if not isinstance(spec, TaskSpec):
        raise ValueError(f"register_task takes a TaskSpec, got {type(spec).__name__}")
    if isinstance(task, str):
        if task.count(":") != 1 or not all(task.split(":")):
            raise ValueError(f"task path {task!r} of {spec.name!r} is not 'module:Class'")
    elif not isinstance(task, type):
        raise ValueError(f"task {task!r} of {spec.name!r} is neither a Task class nor a "
                         "'module:Class' path")
    if spec.name in _DESCRIPTORS and not replace:
        raise ValueError(f"task {spec.name!r} is already registered; accepted: a new name, or "
                         "replace=True")
    _DESCRIPTORS[spec.name] = spec
    _PLAYERS[spec.name] = task
    return spec


def unregister_task(name: str) -> TaskSpec:
    """Remove the task ``name`` (a test's own task, once it is done); returns its descriptor."""
    spec = task_spec(name)
    del _DESCRIPTORS[name], _PLAYERS[name]
    return spec


def task_names() -> tuple[str, ...]:
    """The registered tasks' names, in registration order."""
    return tuple(_DESCRIPTORS)


def task_spec(name: str) -> TaskSpec:
    """The descriptor registered as ``name`` (a one-line `ValueError` naming those that are)."""
    found = _DESCRIPTORS.get(name)
    if found is None:
        raise ValueError(f"unknown task {name!r}; accepted: {', '.join(_DESCRIPTORS)}")
    return found


def task_class(name: str) -> Any:
    """The `Task` class that plays task ``name``, imported on first use (this imports torch).

    Raises:
        ValueError: an unknown name, or a class whose ``spec`` is not the registered one.
    """
    spec = task_spec(name)
    task = _PLAYERS[name]
    if isinstance(task, str):
        module, _, qualname = task.partition(":")
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        task = found
    if getattr(task, "spec", None) is not spec:
        raise ValueError(f"{task.__name__} plays task {name!r} but its spec is not the "
                         "registered one; accepted: a Task class whose spec is the TaskSpec "
                         "passed to register_task")
    return task


# --- the data checks --------------------------------------------------------------------------
def _check_cifar10(data_dir: str | None, block_size: int | None) -> None:
    """CIFAR-10's batch folder under ``data_dir`` (or the default folder); images, no blocks."""
    if find_batches_dir(data_dir) is None:
        raise cifar10_not_found(resolve_data_dir(data_dir))


def _check_text(data_dir: str | None, block_size: int | None) -> None:
    """A text file at ``data_dir``, or one in the folder (`find_text_file`), each part of which
    holds a block of ``block_size`` tokens (`check_text_size`)."""
    file = find_text_file(data_dir)
    if block_size is not None:
        check_text_size(file, block_size)


def refuse_data_dir(name: str) -> DataCheck:
    """The data check of a task that makes its own data: ``data_dir`` must be null.

    Args:
        name: the task's name, for the message.
    """

    def check(data_dir: str | None, block_size: int | None) -> None:
        if data_dir is not None:
            raise DataError(f"task {name!r} makes its own data, got data_dir={data_dir!r}; "
                            "accepted: data_dir null")

    return check


# --- the built-in tasks -----------------------------------------------------------------------
#: CIFAR-10 classification with `CifarCNNHost` (`envs.tasks.CifarTask`).
CIFAR = register_task(TaskSpec(
    name="cifar", topology="cnn", num_classes=10,
    presets=PRESETS, default_preset="baseline", default_slots=("r0c0", "r0c1", "r0c2"),
    default_host_lr=0.01, check_data=_check_cifar10, example="image",
), "esper_lightning.envs.tasks:CifarTask")
#: Next-byte prediction with `GPTHost` (`envs.tasks.TextTask`).
LM = register_task(TaskSpec(
    name="lm", topology="transformer",
    num_classes=256, presets=GPT_PRESETS, default_preset="tiny",
    default_slots=("r0c0", "r0c1"), default_host_lr=1e-3, check_data=_check_text,
    example="byte", loss_in_bits=True, takes_block_size=True, grows_depth=True,
    subset_per_epoch=True,
), "esper_lightning.envs.tasks:TextTask")
