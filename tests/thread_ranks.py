"""Data-parallel ranks as threads of one process: a summing ``all_reduce`` made of a barrier, so
the DD-PPO mathematics (normaliser moments, shared losses, gradient sums, the KL stop) can be
tested against one process in milliseconds. Collectives are met in program order, as with
torch.distributed; a rank that fails breaks the barrier, so the others fail too, never hang."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


def run_ranks(world: int, fn: Callable[[int, Callable[[Tensor], Tensor]], Any]) -> list[Any]:
    """``fn(rank, all_reduce)`` on ``world`` threads; returns each rank's result in order."""
    barrier = threading.Barrier(world, timeout=60)
    parts: list[Tensor | None] = [None] * world
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def all_reduce_for(rank: int) -> Callable[[Tensor], Tensor]:
        def all_reduce(tensor: Tensor) -> Tensor:
            parts[rank] = tensor.detach().clone()
            barrier.wait()
            total = torch.stack(parts).sum(0)  # type: ignore[arg-type]  # same order everywhere
            barrier.wait()  # nobody overwrites a part before every rank summed
            return total
        return all_reduce

    def main(rank: int) -> None:
        try:
            results[rank] = fn(rank, all_reduce_for(rank))
        except BaseException as err:  # re-raised in the caller's thread
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
