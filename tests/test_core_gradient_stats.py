"""A seed's gradient statistics: the health formula, its flags, the EMAs and the host ratio."""

from __future__ import annotations

import math

import pytest
import torch

from esper_lightning.core.gradient_stats import (
    EXPLODING_GRAD_NORM,
    VANISHING_GRAD_NORM,
    record_gradient_stats,
)
from esper_lightning.core.lifecycle import GRADIENT_EMA_DECAY, SeedMetrics


def test_health_loses_half_a_point_per_vanishing_share_and_point_eight_per_exploding():
    metrics = SeedMetrics()
    grads = [torch.full((1,), 1.0), torch.zeros(3), torch.full((1,), 2 * EXPLODING_GRAD_NORM),
             torch.full((1,), VANISHING_GRAD_NORM / 2)]
    record_gradient_stats(metrics, grads)
    # Norms 1, 0, 20, 5e-8: two of four vanishing, one of four exploding.
    assert metrics.gradient_health == pytest.approx(1 - 0.5 * 0.5 - 0.8 * 0.25)
    assert metrics.has_vanishing and metrics.has_exploding
    assert metrics.gradient_norm == pytest.approx(math.sqrt(1 + 400 + 2.5e-15))


def test_a_non_finite_gradient_scores_zero_and_leaves_the_emas_alone():
    metrics = SeedMetrics(gradient_norm=3.0)
    record_gradient_stats(metrics, [torch.tensor([float("nan")]), torch.ones(2)])
    assert metrics.gradient_health == 0.0 and metrics.has_exploding
    assert metrics.gradient_norm == 3.0


def test_the_norm_and_the_param_normalised_host_ratio_are_emas():
    metrics = SeedMetrics(seed_params=4)
    record_gradient_stats(metrics, [torch.full((4,), 0.5)], host_grad_norm=2.0, host_params=16)
    assert metrics.gradient_norm == 1.0
    assert metrics.gradient_ratio == pytest.approx((1.0 / 2.0) * math.sqrt(16 / 4))
    record_gradient_stats(metrics, [torch.full((4,), 1.0)], host_grad_norm=2.0, host_params=16)
    d = GRADIENT_EMA_DECAY
    assert metrics.gradient_norm == pytest.approx(d * 1.0 + (1 - d) * 2.0)
    assert metrics.gradient_ratio == pytest.approx(d * 1.0 + (1 - d) * 2.0)
    record_gradient_stats(metrics, [])  # no gradients: nothing recorded
    assert metrics.gradient_norm == pytest.approx(d * 1.0 + (1 - d) * 2.0)
