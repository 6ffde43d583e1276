"""scripts/growth_pilot.py: FLOP counting, the schedule, growth by copying, budget accounting."""

from __future__ import annotations

import argparse
import json
import math
import re

import numpy as np
import pytest
import torch
from helpers import script_module


@pytest.fixture(scope="module")
def gp():
    with script_module("growth_pilot") as module:
        yield module


def test_flops_per_step_counts_every_matrix_product_including_attention(gp):
    shape = gp.Shape(width=8, n_head=2, block_size=8, batch=4)
    b, t, d, v = 4, 8, 8, 256
    for depth in (1, 4):
        # Forward: 12 D^2 weights per block and the D x V head, 2 FLOPs per multiply-add, per
        # token; attention's two [T, T] products per block. Backward costs twice the forward.
        forward = 2 * b * t * (12 * d * d * depth + d * v) + 4 * b * t * t * d * depth
        assert gp.flops_per_step(shape, depth) == 3 * forward


def test_schedule_warms_up_holds_and_decays_to_its_final_share(gp):
    s = gp.Schedule(warmup=0.1, decay=0.2, final=0.1)
    assert s.factor(0.0) == 0.0 and s.factor(0.05) == pytest.approx(0.5)
    assert s.factor(0.1) == s.factor(0.5) == s.factor(0.8) == 1.0
    assert s.factor(0.9) == pytest.approx(0.55) and s.factor(1.0) == pytest.approx(0.1)


def test_parse_arm_accepts_the_grammar_and_names_bad_values(gp):
    assert gp.parse_arm("s4@0.5") == gp.Arm("s4@0.5", 4, fraction=0.5)
    arm = gp.parse_arm("stack-identity-0.25")
    assert (arm.n_layer, arm.tau, arm.init) == (1, 0.25, "identity")
    assert arm.phases(100.0) == [(1, 25.0), (4, 100.0)]
    for bad in ("s0", "stack-copy-1.5", "stack-zero-0.5", "s4@0"):
        with pytest.raises(argparse.ArgumentTypeError, match="bad arm"):
            gp.parse_arm(bad)


@pytest.mark.parametrize("init", ["identity", "copy"])
def test_grow_appends_copies_that_join_the_optimizer(gp, init):
    shape = gp.Shape(width=8, n_head=2, block_size=8, batch=4)
    host = gp.build_host(shape, 1, rng_seed=0)
    opt = host.configure_optimizers()
    x = torch.randint(256, (2, 8), generator=torch.Generator().manual_seed(0))
    gp.token_loss(host, x, x).backward()
    opt.step()
    before = host(x)
    n_before = sum(len(g["params"]) for g in opt.param_groups)
    gp.grow(host, opt, 4, init)
    assert len(host.blocks) == 4
    assert sum(len(g["params"]) for g in opt.param_groups) == n_before + 3 * 12  # 12 per block
    same = torch.allclose(host(x), before)
    assert same == (init == "identity")  # identity: the function is unchanged at birth
    decay = next(g for g in opt.param_groups if g["weight_decay"] > 0)
    new_ids = {id(p) for p in host.blocks[3].parameters()}
    assert {id(p) for p in decay["params"]} & new_ids == {
        id(p) for p in host.blocks[3].parameters() if p.dim() >= 2}
    assert host.blocks[3].attn.c_attn.weight is not host.blocks[0].attn.c_attn.weight


def test_flops_to_reach_interpolates_and_t_interval_matches_scipy(gp):
    curve = [[0.0, 3.0], [10.0, 2.0], [20.0, 1.0]]
    assert gp.flops_to_reach(curve, 1.5) == pytest.approx(15.0)
    assert gp.flops_to_reach(curve, 0.5) is None
    low, high = gp.t_interval(np.array([1.0, 2.0, 3.0]))
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    assert (low, high) == pytest.approx((2.0 - half, 2.0 + half))


def test_train_spends_the_budget_and_summarize_pairs_episodes(gp, text_file, tmp_path, capsys):
    out = tmp_path / "runs.jsonl"
    gp.main(["train", "--width", "8", "--n-head", "2", "--block-size", "8", "--batch", "4",
             "--budget", "12", "--arms", "s1", "s4", "stack-identity-0.5", "--lrs", "3e-3",
             "--rng-seeds", "0", "1", "--out", str(out), "--evals", "4",
             "--val-tokens", "256", "--data", str(text_file)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 6
    for r in records:
        big = r["flops_per_step"]["4"]
        assert abs(r["flops_spent"] - r["budget_flops"]) <= big / 2
        assert r["budget_flops"] == 12 * big and len(r["curve"]) == 5
    stack = next(r for r in records if r["arm"] == "stack-identity-0.5")
    assert stack["steps"]["4"] == 6 and stack["growth"]["before"] == stack["growth"]["after"]
    gp.main(["summarize", str(out), "--pair", "s4:s1", "--reach", "stack-identity-0.5:s4"])
    table = capsys.readouterr().out
    assert "| s4 − s1 | 0.003 / 0.003 | 2 |" in table
    assert re.search(r"\| stack-identity-0\.5 → s4 \| [012] / 2 \|", table)
