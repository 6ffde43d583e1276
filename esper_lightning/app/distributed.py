"""Data-parallel PPO (DD-PPO) on Lightning Fabric: launching the processes, and what one is.

``esper-lightning ppo --strategy ddp --devices N --num_nodes M`` runs N x M processes. Fabric
starts them (``ddp``: N copies of the command on this machine; ``ddp_spawn`` / ``ddp_fork``:
from this process) or, under torchrun or SLURM, finds them started and joins them. Each process
(a rank) drives its own env pool of ``envs / world`` envs on its own device; env ``k`` of rank
``r`` is global env ``r * envs / world + k``, whose episode and action-sampling seeds are those
of env ``r * envs / world + k`` of a one-process run. Ranks meet only in the PPO update
(`rl.ppo.ppo_update` with `Ranks.all_reduce`) and to gather the round's statistics for rank 0,
which logs and writes the checkpoint (docs/scaling.md).

The policy lives on the CPU of every rank, so its collectives use a gloo group (the default
group itself on CPU runs; a second, gloo group beside NCCL on GPU runs).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import lightning as L
import torch.distributed as dist
from torch import Tensor

from esper_lightning.app.config import PPORunConfig
from esper_lightning.app.metrics import RoundStats
from esper_lightning.rl.normalizers import AllReduce

if TYPE_CHECKING:
    from lightning.fabric import Fabric

#: RoundStats fields that are wall-clock times: ranks run side by side, so a round took the
#: longest rank's time (summing would count parallel seconds twice).
_SECONDS = ("env_seconds", "controller_seconds", "update_seconds")


@dataclass
class Ranks:
    """Where this process stands in a data-parallel run (one process: the defaults).

    Attributes:
        rank, world_size: this process's global rank and the number of processes.
        device: the device of this process's envs.
        group: the process group of the policy's collectives (None: the default group).
        comm_seconds: time spent in collectives so far (waiting for the slowest rank included).

    Example:
        >>> Ranks().all_reduce_hook() is None  # one process: the update runs as it always did
        True
    """

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    group: Any = None
    comm_seconds: float = field(default=0.0, compare=False)

    @classmethod
    def from_fabric(cls, fabric: Fabric) -> Ranks:
        """This process of a launched Fabric run (every rank must call it: it may create the
        gloo group collectively)."""
        group = None
        if fabric.world_size > 1 and dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo")  # the policy's tensors are on the CPU
        return cls(fabric.global_rank, fabric.world_size, str(fabric.device), group)

    @property
    def is_zero(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: Tensor) -> Tensor:
        """The sum of ``tensor`` over every rank (a new tensor)."""
        start = time.perf_counter()
        out = tensor.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        self.comm_seconds += time.perf_counter() - start
        return out

    def all_reduce_hook(self) -> AllReduce | None:
        """What `ppo_update` and the normalisers take: None on one process."""
        return self.all_reduce if self.world_size > 1 else None

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        start = time.perf_counter()
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        self.comm_seconds += time.perf_counter() - start
        return out


def merge_stats(parts: list[RoundStats]) -> RoundStats:
    """One round's statistics of every rank as one run's: episodes and counters pooled, times
    of the slowest rank, the update's metrics (equal on every rank) from rank 0.

    Example:
        >>> merge_stats([RoundStats(steps=4), RoundStats(steps=4)]).steps
        8
    """
    merged = RoundStats(ppo=dict(parts[0].ppo))
    for part in parts:
        for f in fields(RoundStats):
            value, total = getattr(part, f.name), getattr(merged, f.name)
            if f.name == "ppo":
                continue
            if f.name in _SECONDS:
                setattr(merged, f.name, max(total, value))
            elif isinstance(value, Counter):
                total.update(value)  # adds negative sums too (reward components)
            elif isinstance(value, list):
                total.extend(value)
            else:
                setattr(merged, f.name, total + value)
    return merged


def launch_ppo(config: PPORunConfig) -> list[RoundStats] | None:
    """Run ``config`` on ``config.world_size`` processes; returns rank 0's per-round stats in
    the process that called it when Fabric started the others from here (ddp_spawn, ddp_fork)
    or in rank 0 (ddp, torchrun, SLURM), None in every other rank.

    Example:
        >>> launch_ppo(load_config("smoke", overrides={"strategy": "ddp", "devices": ["2"],
        ...                                             "minibatch_envs": 2}))  # doctest: +SKIP
    """
    fabric = L.Fabric(accelerator="cuda" if config.device == "cuda" else "cpu",
                      strategy=config.strategy, devices=config.world_size // config.num_nodes,
                      num_nodes=config.num_nodes)
    return fabric.launch(_train_rank, config)


def _train_rank(fabric: Fabric, config: PPORunConfig) -> list[RoundStats] | None:
    from esper_lightning.app.trainer import PPOTrainer  # the trainer imports this module

    ranks = Ranks.from_fabric(fabric)
    with fabric.rank_zero_first(local=True):  # one data download per machine, then the rest
        trainer = PPOTrainer(config, ranks)
    history = trainer.train()
    return history if ranks.is_zero else None
