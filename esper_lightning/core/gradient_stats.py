"""A seed's gradient statistics: its health, norm and ratio to the host's, from one step's
gradients.

Gradient health is what the G1 and G5 quality gates read (`core.lifecycle`): ``clamp01(1 −
0.5·frac_vanishing − 0.8·frac_exploding)`` over the seed's per-parameter gradient norms, 0 when
any is not finite. Beside it, the EMA of the seed's total gradient norm and of the
parameter-normalised ratio ``(‖g_seed‖/‖g_host‖)·sqrt(P_host/P_seed)`` (a seed with as much
gradient per parameter as the host scores 1). `SeedSlot.capture_gradient_stats` reads its
seed's gradients and records them here, into its state's `SeedMetrics`.

Example:
    >>> from esper_lightning.core.lifecycle import SeedMetrics
    >>> metrics = SeedMetrics()
    >>> record_gradient_stats(metrics, [torch.full((4,), 0.5), torch.zeros(2)])
    >>> metrics.gradient_health, metrics.has_vanishing, metrics.gradient_norm
    (0.75, True, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from esper_lightning.core.lifecycle import GRADIENT_EMA_DECAY, SeedMetrics

__all__ = ["EXPLODING_GRAD_NORM", "GRAD_EPS", "VANISHING_GRAD_NORM", "record_gradient_stats"]

VANISHING_GRAD_NORM = 1e-7
EXPLODING_GRAD_NORM = 10.0  # 10x the usual clip norm of 1.0
GRAD_EPS = 1e-8


def record_gradient_stats(metrics: SeedMetrics, grads: Sequence[Tensor],
                          host_grad_norm: float | None = None,
                          host_params: int | None = None) -> None:
    """Record one step's seed gradients ``grads`` in ``metrics`` (module docstring): the
    health and its flags always; the norm's EMA when it is finite, and the ratio's when the
    host's norm and parameter count are given. Nothing without gradients."""
    if not grads:
        return
    norms = torch.stack(torch._foreach_norm(list(grads))).float().cpu()
    total = float(norms.norm())
    finite = bool(torch.isfinite(norms).all())
    vanishing = float((norms < VANISHING_GRAD_NORM).float().mean())
    exploding = float(((norms > EXPLODING_GRAD_NORM) | ~torch.isfinite(norms)).float().mean())
    metrics.has_vanishing, metrics.has_exploding = vanishing > 0, exploding > 0
    metrics.gradient_health = (
        min(1.0, max(0.0, 1.0 - 0.5 * vanishing - 0.8 * exploding)) if finite else 0.0
    )
    if not math.isfinite(total):
        return
    metrics.gradient_norm = _ema(metrics.gradient_norm, total)
    if host_grad_norm is not None and host_params and host_grad_norm > GRAD_EPS:
        seed_params = max(1, metrics.seed_params)
        ratio = (total / host_grad_norm) * math.sqrt(host_params / seed_params)
        metrics.gradient_ratio = _ema(metrics.gradient_ratio, ratio)


def _ema(previous: float | None, value: float) -> float:
    if previous is None:
        return value
    return GRADIENT_EMA_DECAY * previous + (1 - GRADIENT_EMA_DECAY) * value
