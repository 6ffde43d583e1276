"""Tests for block seeds: the three inits, the host's growth slots, chained growth, the gates'
per-blueprint pace, the slot context and the LayerScale setting."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from esper_lightning.blueprints import BlueprintError, build, get_spec
from esper_lightning.blueprints.block import BLOCK_INITS, Block, block_blueprint
from esper_lightning.blueprints.registry import LayerScale2d
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.slots import SeedSlot
from esper_lightning.hosts import GPT_PRESETS, GPTConfig, GPTHost

GROWTH = ("r1c0", "r1c1", "r1c2")


def _tokens(shape: tuple[int, ...], rng_seed: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(rng_seed))


def _grow4(rng_seed: int = 0, slots: tuple[str, ...] | None = GROWTH) -> GPTHost:
    torch.manual_seed(rng_seed)
    return GPTHost("grow4", slots=slots).eval()


def _blend_in(slot: SeedSlot, blueprint: str) -> None:
    """Germinate and move the seed to HOLDING at alpha 1 (health as after a real epoch)."""
    slot.germinate(blueprint)
    assert slot.advance().passed  # G1
    slot.tick()
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    assert slot.advance().passed  # G2: no incubation for a block seed
    slot.tick()  # one-epoch blend: alpha 1 now
    assert slot.advance().passed and slot.stage == SeedStage.HOLDING


def _native_like(grown: GPTHost) -> GPTHost:
    """A native 4-block host holding the grown host's weights: block 0, then its seeds."""
    native = GPTHost("w32l4", slots=[]).eval()
    blocks = [grown.blocks[0], *(grown.slots[s].seed for s in GROWTH)]
    with torch.no_grad():
        for name in ("tok_emb", "pos_emb", "ln_f"):
            getattr(native, name).load_state_dict(getattr(grown, name).state_dict())
        for target, source in zip(native.blocks, blocks, strict=True):
            target.load_state_dict(source.state_dict())
    return native


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- presets and slots ----------------------------------------------------------------------
def test_grow4_presets_and_slot_ids():
    grow4, w32l1, w32l4 = GPT_PRESETS["grow4"], GPT_PRESETS["w32l1"], GPT_PRESETS["w32l4"]
    assert grow4.slot_ids == ("r0c0", "r1c0", "r1c1", "r1c2") and grow4.max_depth == 4
    assert w32l1.slot_ids == ("r0c0",) and w32l4.slot_ids == ("r0c0", "r0c1", "r0c2", "r0c3")
    shape = {(c.n_embd, c.n_head, c.block_size) for c in (grow4, w32l1, w32l4)}
    assert shape == {(32, 4, 32)}
    counts = {name: sum(p.numel() for p in GPTHost(name).parameters())
              for name in ("grow4", "w32l1", "w32l4")}
    assert counts == {"grow4": 21_984, "w32l1": 21_984, "w32l4": 60_096}  # as commented
    with pytest.raises(ValueError, match="growth_slots must be an int >= 0, got -1"):
        GPTConfig(growth_slots=-1)


def test_empty_growth_slots_are_the_identity_and_the_init_is_for_the_full_depth():
    torch.manual_seed(0)
    grown = GPTHost("grow4", slots=GROWTH)
    torch.manual_seed(0)
    plain = GPTHost(GPTConfig(block_size=32, n_layer=1, n_head=4, n_embd=32), slots=[])
    idx = _tokens((2, 16), rng_seed=1)
    # Same draws, but the residual projections are scaled for 4 blocks, not 1.
    ratio = grown.blocks[0].mlp.c_proj.weight / plain.blocks[0].mlp.c_proj.weight
    torch.testing.assert_close(ratio, torch.full_like(ratio, 1 / 2))  # sqrt(2) / sqrt(8)
    with torch.no_grad():
        plain.blocks[0].load_state_dict(grown.blocks[0].state_dict())
        assert torch.equal(grown(idx), plain(idx))


# --- the three inits --------------------------------------------------------------------------
def test_copy_block_equals_its_source_block_at_birth_and_growth_chains():
    host = _grow4()
    host.slots["r1c0"].germinate("block_copy")
    first = host.slots["r1c0"].seed
    assert isinstance(first, Block) and first is not host.blocks[0]
    assert _same_weights(first, host.blocks[0])
    with torch.no_grad():  # the first seed trained away from block 0
        first.attn.c_attn.weight.add_(0.5)
    # A block seed in r1c1 builds on the seed in r1c0, not on block 0.
    host.slots["r1c1"].germinate("block_copy")
    second = host.slots["r1c1"].seed
    assert _same_weights(second, first) and not _same_weights(second, host.blocks[0])
    # A slot whose earlier growth slots are empty builds on the last block before it.
    other = _grow4()
    other.slots["r1c2"].germinate("block_copy")
    assert _same_weights(other.slots["r1c2"].seed, other.blocks[0])


def test_copied_block_parameters_are_new_tensors():
    host = _grow4()
    host.slots["r1c0"].germinate("block_copy")
    seed_ptrs = {p.data_ptr() for p in host.slots["r1c0"].seed.parameters()}
    assert not seed_ptrs & {p.data_ptr() for p in host.blocks[0].parameters()}


def test_identity_block_leaves_the_host_output_bitwise_unchanged_at_birth():
    host = _grow4(rng_seed=3)
    idx = _tokens((3, 20), rng_seed=4)
    with torch.no_grad():
        before = host(idx)
    for slot_id in GROWTH:  # stacked, each at alpha 1 (blended in) and then fossilized
        _blend_in(host.slots[slot_id], "block_identity")
        with torch.no_grad():
            assert torch.equal(host(idx), before), slot_id
    seed = host.slots["r1c0"].seed
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert torch.equal(seed(x), x)  # the block itself is the identity
    for proj in (seed.attn.c_proj, seed.mlp.c_proj):
        assert not proj.weight.any() and not proj.bias.any()
    c_attn = seed.attn.c_attn.weight  # the rest is the copy (the pilot's identity init)
    assert torch.equal(c_attn, host.blocks[0].attn.c_attn.weight)


def test_identity_block_learns_through_its_zero_projections():
    host = _grow4(rng_seed=5).train()
    _blend_in(host.slots["r1c0"], "block_identity")
    idx, targets = _tokens((2, 12), rng_seed=1), _tokens((2, 12), rng_seed=2)
    F.cross_entropy(host(idx).flatten(0, 1), targets.flatten()).backward()
    seed = host.slots["r1c0"].seed
    assert seed.attn.c_proj.weight.grad.abs().sum() > 0
    assert seed.mlp.c_proj.weight.grad.abs().sum() > 0


def test_random_block_has_the_hosts_shape_and_init():
    host = _grow4(rng_seed=7)
    host.slots["r1c0"].germinate("block_random")
    seed = host.slots["r1c0"].seed
    assert (seed.n_head, seed.depth, seed.bias) == (4, 4, True)
    assert not _same_weights(seed, host.blocks[0])
    torch.manual_seed(11)
    big = Block.like(Block(256, n_head=4, depth=4))  # wide: the sample std is sharp
    assert big.attn.c_attn.bias.abs().sum() == 0 and torch.equal(big.ln_1.weight,
                                                                  torch.ones(256))
    assert big.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert big.mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.02)


# --- growth equals depth ----------------------------------------------------------------------
@pytest.mark.parametrize("init", sorted(BLOCK_INITS))
def test_three_blended_block_seeds_compute_a_native_four_block_host(init: str):
    host = _grow4(rng_seed=1)
    for slot_id in GROWTH:
        _blend_in(host.slots[slot_id], block_blueprint(init))
    with torch.no_grad():  # train-like perturbation: the seeds differ from their sources
        for slot_id in GROWTH:
            for p in host.slots[slot_id].seed.parameters():
                p.add_(0.05 * torch.randn_like(p))
    native = _native_like(host)
    idx = _tokens((3, 32), rng_seed=2)
    with torch.no_grad():
        torch.testing.assert_close(host(idx), native(idx), rtol=1e-5, atol=1e-5)


def test_born_grown_host_is_a_native_four_block_host_at_birth():
    host = _grow4(rng_seed=2)
    engine = MorphogenesisEngine(host)
    for slot_id in GROWTH:
        engine.implant(slot_id, "block_random")
    assert [host.slots[s].stage for s in GROWTH] == [SeedStage.FOSSILIZED] * 3
    assert all(host.slots[s].alpha == 1.0 for s in GROWTH)
    native = _native_like(host)
    idx = _tokens((2, 32), rng_seed=3)
    with torch.no_grad():
        torch.testing.assert_close(host(idx), native(idx), rtol=1e-5, atol=1e-5)
    # The same init scale as a native 4-block host's blocks.
    assert {host.slots[s].seed.depth for s in GROWTH} == {native.blocks[0].depth} == {4}


# --- context -----------------------------------------------------------------------------------
def test_block_seed_without_a_preceding_block_is_a_one_line_error():
    slot = SeedSlot("x", channels=32, topology="transformer")
    with pytest.raises(ValueError) as err:
        slot.germinate("block_copy")
    message = str(err.value)
    assert "\n" not in message and message.startswith("slot 'x': blueprint 'block_copy' needs "
                                                      "the transformer block the slot follows")
    assert "accepted: a slot after a transformer Block" in message
    assert slot.stage == SeedStage.DORMANT and slot.seed is None
    with pytest.raises(BlueprintError, match="needs the transformer block the slot follows"):
        build("block_copy", 32, "transformer")


def test_engine_turns_a_block_seed_without_a_block_into_a_wait():
    model = nn.Module()
    model.net = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    engine = MorphogenesisEngine(model, slots=["net.0"], topology="transformer")
    model.net(torch.zeros(2, 3, 8))
    outcome = engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="block_identity"))
    assert not outcome.success and outcome.executed == Action()
    assert "needs the transformer block the slot follows" in outcome.reason
    assert engine.slots["net.0"].stage == SeedStage.DORMANT


def test_a_slot_injected_after_a_block_follows_it():
    model = nn.Module()
    torch.manual_seed(0)
    model.blocks = nn.Sequential(Block.like(Block(16, 2)), Block.like(Block(16, 2)))
    engine = MorphogenesisEngine(model, slots=["blocks.0"], topology="transformer")
    model.blocks(torch.zeros(1, 4, 16))
    assert engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="block_copy")).success
    assert _same_weights(engine.slots["blocks.0"].seed, model.blocks[0])


def test_state_dict_round_trip_rebuilds_chained_block_seeds():
    host = _grow4(rng_seed=4)
    for slot_id in GROWTH:
        _blend_in(host.slots[slot_id], "block_copy")
        with torch.no_grad():
            for p in host.slots[slot_id].seed.parameters():
                p.add_(0.01 * torch.randn_like(p))
    restored = _grow4(rng_seed=9)
    restored.load_state_dict(copy.deepcopy(host.state_dict()))
    idx = _tokens((2, 16), rng_seed=5)
    with torch.no_grad():
        assert torch.equal(restored(idx), host(idx))
    assert all(isinstance(restored.slots[s].seed, Block) for s in GROWTH)


# --- lifecycle pace and optimizer ---------------------------------------------------------------
def test_block_seed_stage_sequence_without_incubation_and_a_one_epoch_blend():
    host = GPTHost("grow4", slots=GROWTH)
    engine = MorphogenesisEngine(host, gate_config=GateConfig(min_training_epochs=10))
    host(_tokens((2, 8), rng_seed=0))
    slot = engine.slots["r1c0"]
    stages, alphas = [], []
    ops = [LifecycleOp.GERMINATE, LifecycleOp.ADVANCE, LifecycleOp.ADVANCE,
           LifecycleOp.ADVANCE, LifecycleOp.FOSSILIZE]
    for op in ops:
        if slot.stage == SeedStage.TRAINING:  # what an epoch of training measures
            slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
        if slot.stage == SeedStage.HOLDING:
            slot.record_contribution(0.0)
        blueprint = "block_copy" if op == LifecycleOp.GERMINATE else None
        outcome = engine.execute(Action(op, slot=0, blueprint=blueprint))
        assert outcome.success, (op, outcome.reason)
        engine.tick()
        stages.append(slot.stage.name)
        alphas.append(slot.alpha)
    assert stages == ["GERMINATED", "TRAINING", "BLENDING", "HOLDING", "FOSSILIZED"]
    assert alphas == [0.0, 0.0, 1.0, 1.0, 1.0]  # full alpha one epoch after blending began
    assert slot.blend.tempo == 1 and get_spec("block_copy", "transformer").incubation == 0
    # Any other blueprint still incubates the configured 10 epochs.
    other = engine.slots["r1c1"]
    other.germinate("mlp")
    other.advance()
    other.tick()
    other.state.metrics.gradient_health, other.state.metrics.has_exploding = 1.0, False
    assert other.advance().checks_failed == ("min_training_epochs",)


def test_block_seed_parameters_split_decay_like_the_host():
    host = GPTHost("grow4", slots=GROWTH)
    engine = MorphogenesisEngine(host)
    engine.attach_optimizer(host.configure_optimizers())
    host(_tokens((1, 4), rng_seed=0))
    engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="block_random"))
    groups = {g["name"]: g for g in engine.optimizer.param_groups}
    decay, rest = groups["seed/r1c0"], groups["seed/r1c0/no_decay"]
    seed = host.slots["r1c0"].seed
    assert {id(p) for p in decay["params"]} == {id(p) for p in seed.parameters() if p.dim() == 2}
    assert {id(p) for p in rest["params"]} == {id(p) for p in seed.parameters() if p.dim() < 2}
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0


# --- the LayerScale setting ---------------------------------------------------------------------
def test_layer_scale_init_sets_every_gain_of_a_new_seed():
    torch.manual_seed(0)
    default = build("conv_light", 8)
    scaled = build("conv_light", 8, layer_scale=1.0)
    gains = [m.gamma for m in scaled.modules() if isinstance(m, LayerScale2d)]
    assert gains and all(torch.equal(g, torch.ones_like(g)) for g in gains)
    assert all(torch.all(m.gamma == 1e-3) for m in default.modules()
               if isinstance(m, LayerScale2d))
    model = nn.Module()
    model.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    engine = MorphogenesisEngine(model, slots=["net.1"], layer_scale_init=0.5)
    model.net(torch.zeros(1, 3, 8, 8))
    engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light"))
    assert torch.all(engine.slots["net.1"].seed.ls.gamma == 0.5)
    with pytest.raises(ValueError, match="layer_scale_init must be a number >= 0 or None"):
        SeedSlot("s", 8, layer_scale_init=-1.0)


def test_g2_without_incubation_asks_only_for_measured_unexploded_gradients():
    from esper_lightning.core.lifecycle import AlphaView, QualityGates, SeedState

    gates = QualityGates(config=GateConfig(min_training_epochs=3))
    state = SeedState("s", "block_identity", stage=SeedStage.TRAINING)
    alpha = AlphaView(0.0, 0.0, True)
    assert gates.check(SeedStage.BLENDING, state, alpha, incubation=0).checks_failed == (
        "gradient_health_measured", "not_exploding")
    state.metrics.gradient_health, state.metrics.has_exploding = 0.67, False  # 8 of 12 vanish
    assert gates.check(SeedStage.BLENDING, state, alpha, incubation=0).passed
    assert gates.check(SeedStage.BLENDING, state, alpha).checks_failed == (
        "min_training_epochs", "gradient_health")
    state.metrics.has_exploding = True
    assert gates.check(SeedStage.BLENDING, state, alpha, incubation=0).checks_failed == (
        "not_exploding",)
