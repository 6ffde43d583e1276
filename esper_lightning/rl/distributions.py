"""Batched action masks and the masked categorical distribution of the factored policy.

The policy samples its eight heads hierarchically: the op first under its mask, then every other
head under the mask *conditioned on the chosen op* (`MaskBatch.head`), and the blueprint head on
the chosen slot too (a slot may not host every blueprint). A head the op does not use (see
`actions.CAUSAL_RELEVANCE`) is collapsed to its single canonical value, so its log-prob is exactly
0 and its entropy exactly 0; the PPO update re-applies the identical conditioning from the stored
op and slot, so the rollout and the update see the same distributions.

All distribution math runs in float32 whatever the network's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from esper_lightning.core.actions import (
    CANONICAL,
    CAUSAL_RELEVANCE,
    HEADS,
    ActionMasks,
    LifecycleOp,
)

#: Logit given to masked actions: the most negative float32, so exp() underflows to exactly 0.
MASKED_LOGIT = torch.finfo(torch.float32).min

#: ``RELEVANCE[op, h]`` is True when head ``HEADS[h]`` is causally relevant for ``op``.
RELEVANCE = torch.tensor(
    [[head in CAUSAL_RELEVANCE[op] for head in HEADS] for op in LifecycleOp], dtype=torch.bool
)  # [6, 8]


@dataclass(frozen=True)
class MaskBatch:
    """Action masks of a batch (True = legal), any leading shape ``[*B]``.

    Attributes:
        op: ``[*B, 6]`` op mask.
        slot_by_op: ``[*B, 6, S]`` slot mask per op.
        blueprint, style, tempo, alpha_target, alpha_speed, alpha_curve: ``[*B, n_head]`` masks
            of the op-independent heads (before conditioning on the op); ``blueprint`` allows
            what some slot allows.
        blueprint_by_slot: ``[*B, S, n_blueprint]`` blueprint mask per chosen slot (the slot
            head is sampled first, so a sampled germination is one its slot can host).
    """

    op: Tensor
    slot_by_op: Tensor
    blueprint: Tensor
    style: Tensor
    tempo: Tensor
    alpha_target: Tensor
    alpha_speed: Tensor
    alpha_curve: Tensor
    blueprint_by_slot: Tensor

    def head(self, name: str, op: Tensor, slot: Tensor | None = None) -> Tensor:
        """Mask of ``name`` conditioned on the chosen ``op`` (long ``[*B]``) -> bool ``[*B, n]``.

        The slot head uses ``slot_by_op[op]``; the blueprint head, given the chosen ``slot``
        (long ``[*B]``), uses ``blueprint_by_slot[slot]``; a head irrelevant for ``op`` keeps only
        its canonical value (for the slot head: the first legal slot of ``slot_by_op[op]``).
        """
        if name == "op":
            return self.op
        if name == "slot":
            mask = _select(self.slot_by_op, op)  # [*B, S]
            canonical = _one_hot(mask.int().argmax(-1), mask.shape[-1])  # first legal slot
        else:
            mask = (_select(self.blueprint_by_slot, slot)
                    if name == "blueprint" and slot is not None else getattr(self, name))
            canonical = _one_hot(
                torch.full_like(op, int(CANONICAL[name])), mask.shape[-1]
            ).expand_as(mask)
        relevant = RELEVANCE.to(op.device)[op, HEADS.index(name)]  # [*B]
        return torch.where(relevant[..., None], mask, canonical)

    def index(self, key: Tensor | slice | int) -> MaskBatch:
        """Select along the leading batch dimension (e.g. the envs of a minibatch)."""
        return MaskBatch(**{f.name: getattr(self, f.name)[key] for f in fields(self)})


#: Heads a compact action space still samples; the others keep their canonical value.
COMPACT_HEADS = ("op", "slot", "blueprint")


def compact_masks(masks: MaskBatch) -> MaskBatch:
    """The masks of the compact action space: every head outside `COMPACT_HEADS` allows only
    its canonical value (`actions.CANONICAL`: standard tempo, sigmoid-add blend, full alpha
    target, instant alpha speed, linear curve), so the policy learns op, slot and blueprint only
    and those heads carry no log-prob and no entropy."""
    fixed = {}
    for name in HEADS:
        if name in COMPACT_HEADS:
            continue
        mask = torch.zeros_like(getattr(masks, name))
        mask[..., int(CANONICAL[name])] = True
        fixed[name] = mask
    return replace(masks, **fixed)


def fit_blueprint_head(masks: MaskBatch, size: int) -> MaskBatch:
    """The masks with a blueprint head of ``size`` entries: a policy's head size when the
    blueprint table has grown since the policy was created (or shrunk: the policy was created
    in a process that had registered more). Entries are padded with False or dropped.

    Raises:
        ValueError: if a dropped entry is legal (the policy has no head entry for a blueprint
            the masks allow: check the run's blueprints first, `rl.checkpoint.check_blueprints`).
    """
    width = masks.blueprint.shape[-1]
    if width == size:
        return masks
    if width > size and bool(masks.blueprint[..., size:].any()):
        raise ValueError(f"the masks allow blueprint indices >= {size}, beyond the policy's "
                         f"blueprint head")
    return replace(masks, blueprint=_fit_last(masks.blueprint, size),
                   blueprint_by_slot=_fit_last(masks.blueprint_by_slot, size))


def _fit_last(mask: Tensor, size: int) -> Tensor:
    """``mask`` with its last dimension cut or padded with False to ``size``."""
    width = mask.shape[-1]
    if width >= size:
        return mask[..., :size]
    return torch.cat([mask, mask.new_zeros(*mask.shape[:-1], size - width)], dim=-1)


def stack_masks(masks: Sequence[ActionMasks]) -> MaskBatch:
    """Stack per-env `ActionMasks` into a `MaskBatch` with batch shape ``[len(masks)]``."""
    if not masks:
        raise ValueError("stack_masks needs at least one ActionMasks")
    return MaskBatch(
        **{
            f.name: torch.from_numpy(np.stack([getattr(m, f.name) for m in masks]).astype(bool))
            for f in fields(MaskBatch)
        }
    )


def empty_mask_batch(shape: Sequence[int], n_slots: int, head_sizes: dict[str, int]) -> MaskBatch:
    """All-false masks of batch shape ``shape`` (rollout-buffer storage, filled step by step)."""
    sizes = {name: head_sizes[name] for name in HEADS if name not in ("op", "slot")}
    n_ops = head_sizes["op"]
    return MaskBatch(
        op=torch.zeros(*shape, n_ops, dtype=torch.bool),
        slot_by_op=torch.zeros(*shape, n_ops, n_slots, dtype=torch.bool),
        **{name: torch.zeros(*shape, n, dtype=torch.bool) for name, n in sizes.items()},
        blueprint_by_slot=torch.zeros(*shape, n_slots, sizes["blueprint"], dtype=torch.bool),
    )


def _select(rows: Tensor, index: Tensor) -> Tensor:
    """Row ``index`` of ``rows`` per batch element: ``[*B, K, n]``, long ``[*B]`` -> ``[*B, n]``."""
    gather = index[..., None, None].expand(*index.shape, 1, rows.shape[-1])
    return rows.gather(-2, gather).squeeze(-2)


def _one_hot(index: Tensor, n: int) -> Tensor:
    return torch.nn.functional.one_hot(index, n).bool()


class MaskedCategorical:
    """Categorical over the legal actions of ``mask``; illegal actions get probability 0.

    Args:
        logits: ``[*B, n]`` raw logits (any float dtype; cast to float32).
        mask: ``[*B, n]`` bool, True = legal. Every row needs at least one legal action.

    Raises:
        ValueError: if a row of ``mask`` has no legal action (a bug in the masks).
    """

    def __init__(self, logits: Tensor, mask: Tensor) -> None:
        if logits.shape != mask.shape:
            raise ValueError(f"logits {tuple(logits.shape)} and mask {tuple(mask.shape)} differ")
        if not bool(mask.any(-1).all()):
            raise ValueError("action mask with no legal action")
        self.mask = mask
        masked = torch.where(mask, logits.float(), MASKED_LOGIT)
        self.log_probs_all = masked.log_softmax(-1)  # [*B, n]
        self.n_valid = mask.sum(-1)  # [*B]

    def sample(self, generators: Sequence[torch.Generator] | None = None) -> Tensor:
        """Draw one action per row: from the global torch RNG, or row ``i`` from
        ``generators[i]`` (one stream per env, so what an env draws does not depend on which
        other envs share the batch, or the process)."""
        probs = self.log_probs_all.exp()
        flat = probs.reshape(-1, probs.shape[-1])
        if generators is None:
            return torch.multinomial(flat, 1).view(probs.shape[:-1])
        if len(generators) != flat.shape[0]:
            raise ValueError(f"{len(generators)} generators for {flat.shape[0]} rows")
        rows = [torch.multinomial(row, 1, generator=g) for row, g in zip(flat, generators,
                                                                         strict=True)]
        return torch.cat(rows).view(probs.shape[:-1])

    def mode(self) -> Tensor:
        """The most likely legal action per row (deterministic acting)."""
        return torch.where(self.mask, self.log_probs_all, -math.inf).argmax(-1)

    def log_prob(self, action: Tensor) -> Tensor:
        """Log-probability of ``action`` (long ``[*B]``); raises if an action is illegal."""
        legal = self.mask.gather(-1, action[..., None]).squeeze(-1)
        if not bool(legal.all()):
            raise ValueError("log_prob of an action its mask forbids")
        return self.log_probs_all.gather(-1, action[..., None]).squeeze(-1)

    def entropy(self) -> Tensor:
        """Shannon entropy in nats ``[*B]`` (masked actions contribute exactly 0)."""
        p_log_p = self.log_probs_all.exp() * self.log_probs_all
        return -torch.where(self.mask, p_log_p, 0.0).sum(-1)

    def normalized_entropy(self) -> Tensor:
        """Entropy / ln(number of legal actions), in [0, 1]; 0 when one action is legal."""
        log_n = self.n_valid.float().clamp(min=2).log()
        return torch.where(self.n_valid > 1, self.entropy() / log_n, 0.0)
