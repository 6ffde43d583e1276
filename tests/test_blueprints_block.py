"""Tests for the GPT `Block` and GPT-2's init of it."""

from __future__ import annotations

import math

import pytest
import torch

from esper_lightning.blueprints.block import Block, init_residual_projections


def test_block_like_is_the_hosts_init_at_its_depth():
    torch.manual_seed(11)
    big = Block.like(Block(256, n_head=4, depth=4))  # wide: the sample std is sharp
    assert big.attn.c_attn.bias.abs().sum() == 0
    assert torch.equal(big.ln_1.weight, torch.ones(256))
    assert big.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert big.mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.02)
    init_residual_projections(big, depth=1)
    assert big.attn.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(2), rel=0.02)


def test_a_block_is_causal_and_keeps_its_shape():
    torch.manual_seed(0)
    block = Block.like(Block(16, n_head=2))
    x = torch.randn(2, 6, 16)
    y = block(x)
    assert y.shape == x.shape
    changed = x.clone()
    changed[:, 4:] += 1.0  # the future changes: the past's outputs do not
    assert torch.equal(block(changed)[:, :4], y[:, :4])
    with pytest.raises(ValueError, match="n_head=3 must divide the width 16"):
        Block(16, n_head=3)
