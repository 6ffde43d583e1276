"""`Ranks`: where one process stands in a data-parallel PPO run (DD-PPO), and its collectives.

Every process of a run holds one; a one-process run holds the default one. The trainer reduces
through it in the PPO update (`rl.ppo.ppo_update` takes `Ranks.all_reduce_hook`) and gathers the
round's statistics for rank 0 (`Ranks.gather`). Launching the processes is `app.ppo.distributed`.

The policy lives on the CPU of every rank, so its collectives use a gloo group (the default
group itself on CPU runs; a second, gloo group beside NCCL on GPU runs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import Tensor

from esper_lightning.rl.normalizers import AllReduce, single_process

if TYPE_CHECKING:
    from lightning.fabric import Fabric


@dataclass
class Ranks:
    """Where this process stands in a data-parallel run (one process: the defaults).

    Attributes:
        rank, world_size: this process's global rank and the number of processes.
        device: the device of this process's envs.
        group: the process group of the policy's collectives (None: the default group).
        comm_seconds: time spent in collectives so far (waiting for the slowest rank included).

    Example:
        >>> Ranks().all_reduce_hook() is single_process  # one process: the sum is the tensor
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

    def all_reduce_hook(self) -> AllReduce:
        """What `ppo_update` and the normalisers take: `single_process` (the identity, no
        collective) on one process, so one process runs the same formulas as many."""
        return self.all_reduce if self.world_size > 1 else single_process

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        start = time.perf_counter()
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        self.comm_seconds += time.perf_counter() - start
        return out
