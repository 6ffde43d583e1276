"""Tests for the growth operators on `GPTHost`'s growth slots: the three built-ins, chained
growth, grown equals native, the gates' per-blueprint pace, the optimizer groups, the registry of
operators, and the LayerScale setting."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from esper_lightning.blueprints import BlueprintError, build, get_spec, scratch_registry
from esper_lightning.blueprints.block import Block
from esper_lightning.blueprints.growth import (
    GrownBlocks,
    GrowthOperator,
    GrowthSite,
    get_operator,
    growth_blueprint,
    operator_of,
    operators,
    register_operator,
    scratch_operators,
)
from esper_lightning.blueprints.registry import LayerScale2d
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import (
    AlphaView,
    GateConfig,
    QualityGates,
    SeedStage,
    SeedState,
)
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot
from esper_lightning.hosts import GPT_PRESETS, GPTConfig, GPTHost

#: grow4x1's growth slots, one block each; grow4's one growth slot of three blocks.
CHAIN = ("r1c0", "r1c1", "r1c2")
ONE = ("r1c0",)


def _tokens(shape: tuple[int, ...], rng_seed: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(rng_seed))


def _host(preset: str = "grow4", rng_seed: int = 0,
          slots: tuple[str, ...] | None = None) -> GPTHost:
    torch.manual_seed(rng_seed)
    return GPTHost(preset, slots=slots or GPT_PRESETS[preset].growth_slot_ids).eval()


def _blend_in(slot: SeedSlot, blueprint: str) -> None:
    """Germinate (straight to BLENDING) and move the seed to HOLDING at alpha 1."""
    assert slot.germinate(blueprint).passed and slot.stage == SeedStage.BLENDING
    while slot.alpha < 1.0:
        slot.tick()
    assert slot.advance().passed and slot.stage == SeedStage.HOLDING


def _grown_blocks(host: GPTHost) -> list[Block]:
    """The host's blocks in forward order, its growth seeds' included."""
    blocks = list(host.blocks)
    for slot_id in host.config.growth_slot_ids:
        blocks += list(host.slots[slot_id].seed)
    return blocks


def _native_like(grown: GPTHost, preset: str) -> GPTHost:
    """A native host of ``preset``'s depth holding the grown host's weights: its blocks, then
    its seeds' blocks."""
    native = GPTHost(preset, slots=[]).eval()
    with torch.no_grad():
        for name in ("tok_emb", "pos_emb", "ln_f"):
            getattr(native, name).load_state_dict(getattr(grown, name).state_dict())
        for target, source in zip(native.blocks, _grown_blocks(grown), strict=True):
            target.load_state_dict(source.state_dict())
    return native


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _perturb(module: nn.Module, scale: float = 0.05) -> None:
    """A train-like change, so a seed differs from the block it was built from."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))


# --- presets and slots ----------------------------------------------------------------------
def test_growth_presets_slot_ids_and_parameter_counts():
    presets = {name: GPT_PRESETS[name] for name in ("grow4", "grow4x1", "grow2", "grow124",
                                                    "w32l1", "w32l2", "w32l4", "grow2-w64",
                                                    "grow124-w64")}
    assert {(c.n_embd, c.n_head, c.block_size) for c in presets.values()} == {(32, 4, 32),
                                                                               (64, 8, 32)}
    assert {n: (c.slot_ids, c.growth_depths, c.max_depth) for n, c in presets.items()} == {
        "grow4": (("r0c0", "r1c0"), (3,), 4),
        "grow4x1": (("r0c0", *CHAIN), (1, 1, 1), 4),
        "grow2": (("r0c0", "r1c0"), (1,), 2),
        "grow124": (("r0c0", "r1c0", "r1c1"), (1, 2), 4),
        "w32l1": (("r0c0",), (), 1),
        "w32l2": (("r0c0", "r0c1"), (), 2),
        "w32l4": (("r0c0", "r0c1", "r0c2", "r0c3"), (), 4),
        "grow2-w64": (("r0c0", "r1c0"), (1,), 2),
        "grow124-w64": (("r0c0", "r1c0", "r1c1"), (1, 2), 4),
    }
    counts = {}
    for name in presets:  # as commented in hosts/presets.py: as built / grown to full depth
        host = GPTHost(name)
        before = sum(p.numel() for p in host.parameters())
        for slot_id in host.config.growth_slot_ids:
            host.slots[slot_id].germinate("block_random")
        counts[name] = (before, sum(p.numel() for p in host.parameters()))
    assert counts == {"grow4": (21_984, 60_096), "grow4x1": (21_984, 60_096),
                      "grow2": (21_984, 34_688), "grow124": (21_984, 60_096),
                      "w32l1": (21_984, 21_984), "w32l2": (34_688, 34_688),
                      "w32l4": (60_096, 60_096), "grow2-w64": (68_544, 118_528),
                      "grow124-w64": (68_544, 218_496)}
    host = GPTHost("grow4")
    assert host.slots["r0c0"].growth is None and host.slots["r1c0"].growth.blocks == 3
    host = GPTHost("grow124")
    assert [host.slots[s].growth.blocks for s in ("r1c0", "r1c1")] == [1, 2]
    for field, bad in (("growth_slots", -1), ("growth_depth", 0)):
        with pytest.raises(ValueError, match=f"{field} must be an int >= "):
            GPTConfig(**{field: bad})
    for bad in ((1, 2), (1, 0), 1.5):  # one per growth slot (here 3), each an int >= 1
        with pytest.raises(ValueError, match="growth_depth must be an int >= 1, or one per "
                                             r"growth slot \(3\)"):
            GPTConfig(growth_slots=3, growth_depth=bad)


def test_empty_growth_slots_are_the_identity_and_the_init_is_for_the_full_depth():
    grown = _host("grow4")
    torch.manual_seed(0)
    plain = GPTHost(GPTConfig(block_size=32, n_layer=1, n_head=4, n_embd=32), slots=[]).eval()
    idx = _tokens((2, 16), rng_seed=1)
    # Same draws, but the residual projections are scaled for 4 blocks, not 1.
    ratio = grown.blocks[0].mlp.c_proj.weight / plain.blocks[0].mlp.c_proj.weight
    torch.testing.assert_close(ratio, torch.full_like(ratio, 1 / 2))  # sqrt(2) / sqrt(8)
    with torch.no_grad():
        plain.blocks[0].load_state_dict(grown.blocks[0].state_dict())
        assert torch.equal(grown(idx), plain(idx))


# --- the three inits --------------------------------------------------------------------------
def test_a_copy_seed_is_copies_of_the_block_it_follows():
    host = _host("grow4")
    host.slots["r1c0"].germinate("block_copy")
    seed = host.slots["r1c0"].seed
    assert isinstance(seed, GrownBlocks) and len(seed) == 3
    assert all(type(b) is Block and _same_weights(b, host.blocks[0]) for b in seed)
    pointers = [{p.data_ptr() for p in m.parameters()} for m in (host.blocks[0], *seed)]
    assert sum(map(len, pointers)) == len(set().union(*pointers))  # new tensors, none shared


def test_growth_chains_on_the_last_block_before_the_slot():
    host = _host("grow4x1")
    host.slots["r1c0"].germinate("block_copy")
    (first,) = host.slots["r1c0"].seed
    assert isinstance(first, Block) and _same_weights(first, host.blocks[0])
    with torch.no_grad():  # the first seed trained away from block 0
        first.attn.c_attn.weight.add_(0.5)
    # A block seed in r1c1 builds on the seed in r1c0, not on block 0.
    host.slots["r1c1"].germinate("block_copy")
    (second,) = host.slots["r1c1"].seed
    assert _same_weights(second, first) and not _same_weights(second, host.blocks[0])
    # A slot whose earlier growth slots are empty builds on the last block before it.
    other = _host("grow4x1")
    other.slots["r1c2"].germinate("block_copy")
    assert _same_weights(other.slots["r1c2"].seed[0], other.blocks[0])
    # After a seed of several blocks, the next copies the last blocks, in order (stacking).
    config = GPTConfig(block_size=16, n_layer=1, n_head=4, n_embd=32, growth_slots=2,
                       growth_depth=2)
    torch.manual_seed(1)
    stacked = GPTHost(config)
    stacked.slots["r1c0"].germinate("block_random")
    stacked.slots["r1c1"].germinate("block_copy")
    below, above = stacked.slots["r1c0"].seed, stacked.slots["r1c1"].seed
    assert _same_weights(above[0], below[0]) and _same_weights(above[1], below[1])
    assert not _same_weights(above[0], above[1])
    # One block to two, then two to four (grow124): the second event copies both, in order.
    doubling = _host("grow124")
    doubling.slots["r1c0"].germinate("block_copy")
    (grown,) = doubling.slots["r1c0"].seed
    with torch.no_grad():
        grown.attn.c_attn.weight.add_(0.5)
    doubling.slots["r1c1"].germinate("block_copy")
    first, second = doubling.slots["r1c1"].seed
    assert _same_weights(first, doubling.blocks[0]) and _same_weights(second, grown)


@pytest.mark.parametrize("preset", ["grow4", "grow4x1", "grow2", "grow124"])
def test_identity_seeds_leave_the_host_output_bitwise_unchanged_at_birth(preset: str):
    host = _host(preset, rng_seed=3)
    idx = _tokens((3, 20), rng_seed=4)
    with torch.no_grad():
        before = host(idx)
    for slot_id in host.config.growth_slot_ids:
        slot = host.slots[slot_id]
        slot.germinate("block_identity")
        assert slot.stage == SeedStage.BLENDING and slot.alpha == 1.0  # at once
        with torch.no_grad():
            assert torch.equal(host(idx), before), slot_id
        slot.tick()
        assert slot.advance().passed
        with torch.no_grad():
            assert torch.equal(host(idx), before), slot_id
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(5))
    for block in _grown_blocks(host)[1:]:  # each block itself is the identity
        with torch.no_grad():
            assert torch.equal(block(x), x)
        for proj in (block.attn.c_proj, block.mlp.c_proj):
            assert not proj.weight.any() and not proj.bias.any()
        # The rest is the copy (the pilot's identity init).
        assert torch.equal(block.attn.c_attn.weight, host.blocks[0].attn.c_attn.weight)


def test_identity_blocks_learn_through_their_zero_projections():
    host = _host("grow4", rng_seed=5).train()
    _blend_in(host.slots["r1c0"], "block_identity")
    idx, targets = _tokens((2, 12), rng_seed=1), _tokens((2, 12), rng_seed=2)
    F.cross_entropy(host(idx).flatten(0, 1), targets.flatten()).backward()
    for block in host.slots["r1c0"].seed:
        assert block.attn.c_proj.weight.grad.abs().sum() > 0
        assert block.mlp.c_proj.weight.grad.abs().sum() > 0


def test_random_blocks_have_the_hosts_shape_and_init_and_differ():
    host = _host("grow4", rng_seed=7)
    host.slots["r1c0"].germinate("block_random")
    seed = host.slots["r1c0"].seed
    assert [(b.n_head, b.depth, b.bias) for b in seed] == [(4, 4, True)] * 3
    blocks = [host.blocks[0], *seed]
    assert not any(_same_weights(a, b) for i, a in enumerate(blocks) for b in blocks[i + 1:])
    torch.manual_seed(11)
    big = Block.like(Block(256, n_head=4, depth=4))  # wide: the sample std is sharp
    assert big.attn.c_attn.bias.abs().sum() == 0 and torch.equal(big.ln_1.weight,
                                                                  torch.ones(256))
    assert big.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert big.mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.02)


def test_a_growth_site_takes_its_sources_from_the_stack_before_it():
    blocks = [Block(8, 2) for _ in range(3)]
    for n, expected in ((1, [2]), (2, [1, 2]), (3, [0, 1, 2]), (5, [0, 1, 2, 0, 1])):
        site = GrowthSite(n, lambda: blocks)
        assert [blocks.index(b) for b in site.sources()] == expected, n
    assert GrowthSite(3, lambda: blocks[:1]).sources() == [blocks[0]] * 3
    with pytest.raises(ValueError, match="a growth slot follows no block"):
        GrowthSite(1, list).sources()
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="adds an int >= 1 of blocks"):
            GrowthSite(bad, list)
    built = build("block_random", 8, "transformer",
                  context={"growth": GrowthSite(2, lambda: blocks)})
    assert isinstance(built, GrownBlocks) and len(built) == 2
    with pytest.raises(BlueprintError, match="needs a growth slot"):
        build("block_random", 8, "transformer")


# --- growth equals depth ----------------------------------------------------------------------
@pytest.mark.parametrize("operator", ["copy", "identity", "random"])
@pytest.mark.parametrize(("preset", "native"),
                         [("grow4", "w32l4"), ("grow4x1", "w32l4"), ("grow2", "w32l2"),
                          ("grow124", "w32l4")])
def test_blended_growth_seeds_compute_the_native_deeper_host(preset: str, native: str,
                                                             operator: str):
    host = _host(preset, rng_seed=1)
    for slot_id in host.config.growth_slot_ids:
        _blend_in(host.slots[slot_id], growth_blueprint(operator))
        _perturb(host.slots[slot_id].seed)
    deep = _native_like(host, native)
    assert len(_grown_blocks(host)) == deep.config.n_layer
    idx = _tokens((3, 32), rng_seed=2)
    with torch.no_grad():  # at alpha 1 the slot outputs its seed's: the deeper host, exactly
        assert torch.equal(host(idx), deep(idx))


@pytest.mark.parametrize(("preset", "native"),
                         [("grow4", "w32l4"), ("grow4x1", "w32l4"), ("grow2", "w32l2"),
                          ("grow124", "w32l4")])
def test_born_grown_host_is_the_native_deeper_host_at_birth(preset: str, native: str):
    host = _host(preset, rng_seed=2)
    engine = MorphogenesisEngine(host)
    growth = host.config.growth_slot_ids
    for slot_id in growth:
        engine.implant(slot_id, "block_random")
    assert {(host.slots[s].stage, host.slots[s].alpha) for s in growth} == {
        (SeedStage.FOSSILIZED, 1.0)}
    deep = _native_like(host, native)
    idx = _tokens((2, 32), rng_seed=3)
    with torch.no_grad():
        assert torch.equal(host(idx), deep(idx))
    # The same init scale as the native host's blocks.
    assert {b.depth for b in _grown_blocks(host)} == {deep.blocks[0].depth}


# --- context -----------------------------------------------------------------------------------
def test_a_growth_seed_outside_a_growth_slot_is_a_one_line_error():
    slot = SeedSlot("x", channels=32, topology="transformer")
    with pytest.raises(ValueError) as err:
        slot.germinate("block_copy")
    message = str(err.value)
    assert "\n" not in message and message.startswith("slot 'x': blueprint 'block_copy' needs "
                                                      "a growth slot")
    assert "accepted: a growth slot (MorphogenesisCallback(growth=DepthGrowth(...))" in message
    assert slot.stage == SeedStage.DORMANT and slot.seed is None
    # GPTHost's slots after its blocks are not growth slots: only r1c* are.
    assert GPTHost("grow4").slots["r0c0"].context_error("block_copy") is not None


def test_a_run_without_a_growth_slot_allows_no_growth_blueprint():
    model = nn.Module()
    model.net = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    engine = MorphogenesisEngine(model, slots=["net.0"], topology="transformer")
    model.net(torch.zeros(2, 3, 8))
    assert not {n for n in engine.mask_context.blueprints if operator_of(n) is not None}
    outcome = engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="block_identity"))
    assert not outcome.success and outcome.executed == Action()
    assert engine.slots["net.0"].stage == SeedStage.DORMANT
    with pytest.raises(ValueError) as err:
        _ = MorphogenesisEngine(model, slots=["net.1"], topology="transformer",
                                seeding=SeedingConfig(blueprints=["lora", "block_copy"])
                                ).mask_context
    assert str(err.value).startswith("blueprint 'block_copy' grows a stack deeper and no slot "
                                     "of this run is a growth slot; accepted: growth=")
    # A host with a growth slot allows them all.
    host_engine = MorphogenesisEngine(_host("grow4", slots=("r0c0", "r1c0")))
    assert {"block_copy", "block_identity", "block_random"} <= set(
        host_engine.mask_context.blueprints)


@pytest.mark.parametrize("preset", ["grow4", "grow4x1"])
def test_state_dict_round_trip_rebuilds_block_seeds(preset: str):
    host = _host(preset, rng_seed=4)
    for slot_id in host.config.growth_slot_ids:
        _blend_in(host.slots[slot_id], "block_copy")
        _perturb(host.slots[slot_id].seed, scale=0.01)
    state = copy.deepcopy(host.state_dict())
    restored = _host(preset, rng_seed=9)
    restored.load_state_dict(state)
    idx = _tokens((2, 16), rng_seed=5)
    with torch.no_grad():
        assert torch.equal(restored(idx), host(idx))
    for slot_id in host.config.growth_slot_ids:
        seed, again = host.slots[slot_id].seed, restored.slots[slot_id].seed
        assert type(again) is type(seed) and _same_weights(again, seed)
        assert restored.slots[slot_id].stage == SeedStage.HOLDING
    # A seed of 3 blocks never loads into a slot that grows 1.
    if preset == "grow4":
        other = _host("grow4x1", rng_seed=9)
        with pytest.raises(ValueError, match="the manifest is of a growth slot of 3 block"):
            other.load_state_dict(state, strict=False)


def test_a_one_block_seed_saved_as_the_bare_block_loads():
    host = _host("grow2", rng_seed=4)
    _blend_in(host.slots["r1c0"], "block_copy")
    _perturb(host.slots["r1c0"].seed)
    state = host.state_dict()
    old = {k.replace("slots.r1c0.seed.0.", "slots.r1c0.seed."): v for k, v in state.items()}
    manifest = dict(old["slots.r1c0._extra_state"])
    del manifest["growth"]  # written before growth sites: blocks per seed as growth_depth
    old["slots.r1c0._extra_state"] = {**manifest, "growth_depth": 1}
    restored = _host("grow2", rng_seed=9)
    restored.load_state_dict(old)
    idx = _tokens((2, 16), rng_seed=5)
    with torch.no_grad():
        assert torch.equal(restored(idx), host(idx))


# --- lifecycle pace and optimizer ---------------------------------------------------------------
def _germinate_in_engine(blueprint: str, preset: str = "grow4"):
    host = _host(preset)
    engine = MorphogenesisEngine(
        host, seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=10)))
    host(_tokens((2, 8), rng_seed=0))
    outcome = engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint=blueprint))
    assert outcome.success, outcome.reason
    return engine, engine.slots["r1c0"]


@pytest.mark.parametrize("operator", ["copy", "identity", "random"])
def test_a_seed_without_incubation_germinates_through_g0_g1_g2_to_blending(operator: str):
    engine, slot = _germinate_in_engine(growth_blueprint(operator))
    assert slot.stage == SeedStage.BLENDING  # in the decision that germinated it
    history = [(SeedStage(e.source).name, SeedStage(e.target).name, e.reason, e.epoch)
               for e in slot.state.history]
    assert history == [("DORMANT", "GERMINATED", "G0 passed", 0),
                       ("GERMINATED", "TRAINING", "G1 passed", 0),
                       ("TRAINING", "BLENDING", "G2 passed", 0)]
    gate = slot.state.last_gate
    assert (gate.gate, gate.passed, gate.checks_passed) == (2, True, ("no_incubation",))
    report = slot.report()
    assert (report.previous_stage, report.epochs_total) == (SeedStage.TRAINING, 0)
    # One germination in the engine's events; the masks let the next slot germinate at once.
    assert [(e.slot_id, e.kind) for e in engine.events] == [("r1c0", "germinated")]
    tempo = {"identity": 0, "copy": 2, "random": 2}[operator]
    assert slot.blend.tempo == tempo == get_operator(operator).tempo
    assert get_spec(growth_blueprint(operator), "transformer").incubation == 0


def test_a_seed_without_incubation_blends_at_its_tempo_from_the_next_step():
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(0))
    _, slot = _germinate_in_engine("block_identity")
    assert slot.alpha == 1.0 and slot.report().alpha_mode == 0  # HOLD: done before any step
    _, slot = _germinate_in_engine("block_copy")
    alphas = [slot.alpha]
    for _ in range(2):
        slot.tick()  # the engine ticks right after the decision, before the next epoch trains
        with torch.no_grad():  # the next training step blends at the ticked alpha
            h, s = x, slot.seed(x)
            expected = s if slot.alpha == 1.0 else h + slot.alpha * (s - h)
            assert torch.equal(slot(x), expected)
        alphas.append(slot.alpha)
    assert alphas == pytest.approx([0.0, 0.5, 1.0]) and alphas[-1] == 1.0


def test_block_seed_stage_sequence_in_the_engine():
    engine, slot = _germinate_in_engine("block_copy", preset="grow4x1")
    stages, alphas = [], []
    ops = [LifecycleOp.WAIT, LifecycleOp.ADVANCE, LifecycleOp.FOSSILIZE]
    engine.tick()  # alpha 1/2: the blend takes one epoch
    for op in ops:
        if slot.stage == SeedStage.HOLDING:
            slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
            slot.record_contribution(0.0)
        outcome = engine.execute(Action(op, slot=0) if op != LifecycleOp.WAIT else Action())
        assert outcome.success, (op, outcome.reason)
        engine.tick()
        stages.append(slot.stage.name)
        alphas.append(slot.alpha)
    assert stages == ["BLENDING", "HOLDING", "FOSSILIZED"]
    assert alphas == [1.0, 1.0, 1.0]
    kinds = [e.kind for e in engine.events]
    assert kinds == ["germinated", "fossilized"]


def test_seeds_that_incubate_are_unchanged_and_their_g2_fails_closed():
    host = _host("grow4x1")
    slot = host.slots["r1c1"]
    slot.gates = QualityGates(config=GateConfig(min_training_epochs=0))
    slot.germinate("mlp")
    assert slot.stage == SeedStage.GERMINATED and slot.blend.tempo == 5
    assert slot.advance().passed and slot.stage == SeedStage.TRAINING
    # Never ran, nothing measured: with no epochs to wait, G2 still refuses it.
    assert slot.advance().checks_failed == ("gradient_health_measured", "not_exploding",
                                            "gradient_health")
    other = host.slots["r1c2"]
    other.gates = QualityGates(config=GateConfig(min_training_epochs=10))
    other.germinate("mlp")
    other.advance()
    other.tick()
    other.state.metrics.gradient_health, other.state.metrics.has_exploding = 1.0, False
    assert other.advance().checks_failed == ("min_training_epochs",)


def test_growth_seed_parameters_split_decay_like_their_sources():
    host = GPTHost("grow4", slots=ONE)
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
    engine = MorphogenesisEngine(model, slots=["net.1"],
                                 seeding=SeedingConfig(layer_scale_init=0.5))
    model.net(torch.zeros(1, 3, 8, 8))
    engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light"))
    assert torch.all(engine.slots["net.1"].seed.ls.gamma == 0.5)
    with pytest.raises(ValueError, match="layer_scale_init must be a number >= 0 or None"):
        SeedSlot("s", 8, layer_scale_init=-1.0)


def test_g2_without_incubation_has_nothing_to_measure_at_birth_and_judges_what_ran():
    gates = QualityGates(config=GateConfig(min_training_epochs=3))
    state = SeedState("s", "block_identity", stage=SeedStage.TRAINING)
    alpha = AlphaView(0.0, 0.0, True)
    for strict in (False, True):  # at birth, in both modes: the seed never ran
        mode_gates = QualityGates("strict" if strict else "permissive", gates.config)
        result = mode_gates.check(SeedStage.BLENDING, state, alpha, incubation=0)
        assert result.passed and result.checks_passed == ("no_incubation",)
    # A seed that incubates is judged on what it has, never passed unmeasured.
    assert gates.check(SeedStage.BLENDING, state, alpha).checks_failed == (
        "min_training_epochs", "gradient_health_measured", "not_exploding", "gradient_health")
    state.tick()  # it ran an epoch in TRAINING (a seed of an older checkpoint): judge it
    assert gates.check(SeedStage.BLENDING, state, alpha, incubation=0).checks_failed == (
        "gradient_health_measured", "not_exploding")
    state.metrics.gradient_health, state.metrics.has_exploding = 0.67, False  # 8 of 12 vanish
    assert gates.check(SeedStage.BLENDING, state, alpha, incubation=0).passed
    state.metrics.has_exploding = True
    assert gates.check(SeedStage.BLENDING, state, alpha, incubation=0).checks_failed == (
        "not_exploding",)


# --- the registry: a new operator is one registration -------------------------------------------
def _halve(source: nn.Module, site: GrowthSite) -> nn.Module:
    """A copy with every weight halved (an operator of one's own)."""
    block = copy.deepcopy(source)
    with torch.no_grad():
        for p in block.parameters():
            p.mul_(0.5)
    return block


def test_a_registered_operator_is_a_blueprint_a_controller_germinates():
    with scratch_registry(), scratch_operators():
        operator = register_operator(GrowthOperator(
            "halve", _halve, preserves_function=False, copies_weights=True,
            description="halved copies"))
        assert operators()[-1] == "halve" and operator_of("block_halve") is operator
        spec = get_spec("block_halve", "transformer")
        assert (spec.incubation, spec.blend_tempo, spec.context) == (0, 2, ("growth",))
        host = _host("grow2")
        engine = MorphogenesisEngine(host)
        assert "block_halve" in engine.mask_context.blueprints
        host(_tokens((1, 4), rng_seed=0))
        assert engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="block_halve")).success
        (block,) = host.slots["r1c0"].seed
        torch.testing.assert_close(block.ln_1.weight, 0.5 * host.blocks[0].ln_1.weight)
        with pytest.raises(BlueprintError, match="'halve' is already registered"):
            register_operator(operator)


@pytest.mark.parametrize(("name", "build_fn", "message"), [
    ("Halve", _halve, "lower-case letters"),
    ("half", "not callable", "build must be callable"),
])
def test_a_bad_operator_is_refused_in_one_line(name, build_fn, message):
    with scratch_operators(), pytest.raises(BlueprintError, match=message):
        register_operator(GrowthOperator(name, build_fn, False, False, "x"))
    with pytest.raises(BlueprintError, match="unknown growth operator 'nope'; accepted: copy, "
                                             "identity, random"):
        get_operator("nope")


def test_the_builtins_state_their_contract():
    contract = {name: (get_operator(name).preserves_function, get_operator(name).copies_weights,
                       get_operator(name).tempo) for name in operators()}
    assert contract == {"copy": (False, True, 2), "identity": (True, True, 0),
                        "random": (False, False, 2)}


def test_copied_blocks_may_start_from_their_sources_moments():
    for moments, expect_copied in (("fresh", False), ("copy", True)):
        host = _host("grow2")
        host.slots["r1c0"].refine_growth(GrowthSite(1, host.slots["r1c0"].growth.stack,
                                                    moments=moments))
        engine = MorphogenesisEngine(host)
        optimizer = host.configure_optimizers()
        engine.attach_optimizer(optimizer)
        idx, targets = _tokens((2, 8), rng_seed=0), _tokens((2, 8), rng_seed=1)
        for _ in range(2):  # the source block has moments now
            optimizer.zero_grad()
            F.cross_entropy(host(idx).flatten(0, 1), targets.flatten()).backward()
            optimizer.step()
        engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="block_copy"))
        (block,) = host.slots["r1c0"].seed
        source = host.blocks[0].attn.c_attn.weight
        state = optimizer.state.get(block.attn.c_attn.weight, {})
        assert bool(state) == expect_copied, moments
        if expect_copied:
            assert torch.equal(state["exp_avg"], optimizer.state[source]["exp_avg"])
            assert state["exp_avg"] is not optimizer.state[source]["exp_avg"]
            assert int(state["step"]) == 2
