"""Data-parallel training for the callbacks: which strategies work, and the few collectives that
keep every rank's lifecycle identical under DDP.

Every rank holds a full copy of the model, so every rank runs the engine. What keeps the copies
equal (docs/design.md, "Distributed"):

* measurements are reduced before anyone reads them: counterfactual correct counts, loss sums
  and totals, the epoch's training-loss sum and batch count (sums, never means of ratios), and
  logged metrics (mean over ranks, identical everywhere whether or not they were logged with
  ``sync_dist=True``);
* the decision is made once: rank 0's action (and its reason) is broadcast, so a stochastic
  controller cannot split the ranks;
* a new seed's initial weights come from ``(rng_seed, epoch)``, with rank 0's ``rng_seed``;
* seeds are created after DDP wrapped the model, so DDP does not reduce their gradients:
  `average_gradients` does, after every backward (before a loss scaler unscales), and DDP is
  told to leave every slot's parameters alone (also seeds restored from a checkpoint before
  wrapping), so a pruned seed never leaves DDP waiting for a gradient.

Every helper is a no-op on one process, so single-device training runs exactly the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from esper_lightning.core.actions import Action
from esper_lightning.core.slots import SeedSlot

#: What the callbacks accept, as the one-line refusal says it.
SUPPORTED = ("strategy='auto' on one device, or 'ddp' / 'ddp_spawn' / 'ddp_fork' on any devices "
             "and nodes")


def check_strategy(trainer: L.Trainer) -> None:
    """Refuse strategies that shard parameters (FSDP, DeepSpeed, model parallel, ...): the engine
    creates and removes whole seed modules, which those strategies would have to re-shard.

    Example:
        >>> check_strategy(L.Trainer(accelerator="cpu", devices=1))  # doctest: +SKIP
    """
    strategy = trainer.strategy
    if isinstance(strategy, SingleDeviceStrategy):
        return
    if isinstance(strategy, DDPStrategy) and not isinstance(strategy, DeepSpeedStrategy):
        return
    raise MisconfigurationException(
        f"MorphogenesisCallback supports {SUPPORTED}; got {type(strategy).__name__}"
    )


def is_distributed(trainer: L.Trainer) -> bool:
    """More than one process holds the model (and the process group is up)."""
    return trainer.world_size > 1 and torch.distributed.is_initialized()


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """The sum of ``tensor`` over every rank (a new tensor; every rank must call this)."""
    out = tensor.clone()
    torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
    return out


def reduce_sum(trainer: L.Trainer, tensor: Tensor) -> Tensor:
    """``tensor`` summed over the ranks; ``tensor`` itself on one process."""
    return all_reduce_sum(tensor) if is_distributed(trainer) else tensor


def mean_over_ranks(trainer: L.Trainer, value: Any) -> float | None:
    """The mean of a logged scalar over the ranks that have it (None where none has), the same
    number on every rank. Every rank must call this, with or without a value."""
    if not is_distributed(trainer):
        return None if value is None else float(value)
    present = value is not None
    part = torch.tensor([float(value) if present else 0.0, float(present)], dtype=torch.float64,
                        device=trainer.strategy.root_device)
    total, count = all_reduce_sum(part).tolist()
    return None if count == 0 else total / count


def any_rank(trainer: L.Trainer, flag: Tensor | None) -> bool:
    """Whether ``flag`` (a bool tensor, None for False) is set on any rank."""
    if not is_distributed(trainer):
        return flag is not None and bool(flag)
    part = torch.zeros((), device=trainer.strategy.root_device)
    if flag is not None:
        part = part + flag.to(part.device, torch.float32).sum()
    return bool(all_reduce_sum(part) > 0)


def broadcast_rng_seed(trainer: L.Trainer, rng_seed: int) -> int:
    """Rank 0's ``rng_seed`` on every rank, so a new seed's weights are equal everywhere."""
    if not is_distributed(trainer):
        return rng_seed
    return int(trainer.strategy.broadcast(int(rng_seed), src=0))


def broadcast_decision(
    trainer: L.Trainer, action: Action, reason: str | None
) -> tuple[Action, str | None]:
    """Rank 0's action and reason on every rank (the decision is made once)."""
    if not is_distributed(trainer):
        return action, reason
    indices, reason = trainer.strategy.broadcast((list(action.indices()), reason), src=0)
    return Action.from_indices(indices), reason


@torch.no_grad()
def average_gradients(trainer: L.Trainer, params: Sequence[nn.Parameter]) -> None:
    """Average the gradients of ``params`` over the ranks, as DDP does for the host (one
    collective per dtype). Parameters without a gradient are skipped: the lifecycle, and so the
    set of seed parameters in the graph, is the same on every rank."""
    if not is_distributed(trainer):
        return
    grads = [p.grad for p in params if p.grad is not None]
    for dtype in dict.fromkeys(g.dtype for g in grads):
        group = [g for g in grads if g.dtype == dtype]
        flat = torch.cat([g.reshape(-1) for g in group])
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
        flat /= trainer.world_size
        for grad, part in zip(group, flat.split([g.numel() for g in group]), strict=True):
            grad.copy_(part.view_as(grad))


def keep_slots_out_of_ddp(module: nn.Module) -> None:
    """Tell DDP (at its next wrapping of ``module``) to leave every slot's parameters and
    buffers to `average_gradients`: seeds restored from a checkpoint exist before DDP wraps the
    model, and a registered seed that is later pruned would leave DDP waiting for its gradient.
    """
    prefixes = tuple(f"{name}." for name, m in module.named_modules() if isinstance(m, SeedSlot))
    names = [name for name, _ in (*module.named_parameters(), *module.named_buffers())
             if name.startswith(prefixes)]
    earlier = getattr(module, "_ddp_params_and_buffers_to_ignore", [])  # the user's own too
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        module, list(dict.fromkeys([*earlier, *names])))
