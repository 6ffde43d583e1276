import copy

import pytest
import torch
from helpers import TinyHost

from esper_lightning.blueprints import available
from esper_lightning.core.alpha import AlphaAlgorithm, AlphaCurve, AlphaMode
from esper_lightning.core.lifecycle import IllegalTransitionError, SeedStage
from esper_lightning.core.slots import SeedSlot


def _measured(slot: SeedSlot, contribution: float | None = None) -> None:
    metrics = slot.state.metrics
    metrics.gradient_health, metrics.has_exploding = 1.0, False
    if contribution is not None:
        slot.record_contribution(contribution)


def drive(slot: SeedSlot, stage: SeedStage, blueprint: str = "conv_light", **germ) -> SeedSlot:
    """Move a fresh slot to ``stage`` through legal operations only."""
    if stage == SeedStage.DORMANT:
        return slot
    slot.germinate(blueprint, **{"tempo": 3, **germ})
    if stage == SeedStage.GERMINATED:
        return slot
    if stage in (SeedStage.PRUNED, SeedStage.EMBARGOED, SeedStage.RESETTING):
        slot.prune("test")
        ticks = {SeedStage.PRUNED: 0, SeedStage.EMBARGOED: 1, SeedStage.RESETTING: 6}[stage]
        for _ in range(ticks):
            slot.tick()
        return slot
    assert slot.advance().passed
    if stage == SeedStage.TRAINING:
        return slot
    for _ in range(10):
        slot.tick()
    _measured(slot)
    assert slot.advance().passed
    if stage == SeedStage.BLENDING:
        slot.tick()  # mid-ramp
        return slot
    for _ in range(3):
        slot.tick()
    assert slot.advance().passed
    if stage == SeedStage.HOLDING:
        return slot
    _measured(slot, contribution=1.0)
    assert slot.fossilize().passed
    return slot


@pytest.mark.parametrize("blueprint", available("cnn"))
def test_incubating_seed_leaves_host_gradients_bitwise_identical(blueprint):
    torch.manual_seed(0)
    plain = TinyHost(SeedSlot("s", channels=8))
    grown = copy.deepcopy(plain)
    drive(grown.slot, SeedStage.TRAINING, blueprint)
    x = torch.randn(4, 3, 9, 7)
    target = torch.randn(4, 4, 9, 7)
    outputs = []
    for model in (plain, grown):
        out = model(x)
        ((out - target) ** 2).mean().backward()
        outputs.append(out)
    assert torch.equal(outputs[0], outputs[1])
    grown_host = {n: p for n, p in grown.named_parameters() if not n.startswith("slot.")}
    plain_host = dict(plain.named_parameters())
    assert grown_host.keys() == plain_host.keys()
    for name, p in plain_host.items():
        assert torch.equal(p.grad, grown_host[name].grad), name
    seed_grads = [p.grad for p in grown.slot.seed_parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in seed_grads)


def test_output_unchanged_at_alpha_zero_while_blending():
    slot = drive(SeedSlot("s", channels=8), SeedStage.TRAINING)
    for _ in range(10):
        slot.tick()
    _measured(slot)
    slot.advance()
    assert slot.stage == SeedStage.BLENDING and slot.alpha == 0.0
    h = torch.randn(2, 8, 5, 5)
    assert torch.equal(slot(h), h)


def test_add_blend_formula_and_per_sample_override():
    slot = drive(SeedSlot("s", channels=8), SeedStage.BLENDING)
    h = torch.randn(3, 8, 4, 4)
    s = slot.seed(h)
    a = slot.alpha
    assert 0 < a < 1
    torch.testing.assert_close(slot(h), h + a * (s - h), rtol=0, atol=1e-6)
    override = torch.tensor([0.0, 1.0, 0.25])
    out = slot(h, alpha_override=override)
    torch.testing.assert_close(out[0], h[0], rtol=0, atol=0)
    torch.testing.assert_close(out[1], s[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(out[2], h[2] + 0.25 * (s[2] - h[2]), rtol=0, atol=1e-6)
    with slot.alpha_override(override):
        torch.testing.assert_close(slot(h), out, rtol=0, atol=0)
    torch.testing.assert_close(slot(h), h + a * (s - h), rtol=0, atol=1e-6)


def test_multiply_and_gate_blends():
    h = torch.randn(2, 8, 4, 4)
    mult = drive(SeedSlot("m", channels=8), SeedStage.BLENDING, algorithm=AlphaAlgorithm.MULTIPLY)
    a = mult.alpha
    expected = h * (1 + a * torch.tanh(mult.seed(h) - h))
    torch.testing.assert_close(mult(h), expected, rtol=0, atol=1e-6)
    gate = drive(SeedSlot("g", channels=8), SeedStage.BLENDING, algorithm=AlphaAlgorithm.GATE)
    g = gate.gate(h)
    assert g.shape == (2, 1, 1, 1)
    s = gate.seed(h)
    torch.testing.assert_close(gate(h), h + (gate.alpha * g) * (s - h), rtol=0, atol=1e-6)
    zero = torch.zeros(2)
    for slot in (mult, gate):
        assert torch.equal(slot(h, alpha_override=zero), h)


def test_isolation_on_while_blending_and_off_from_holding():
    slot = drive(SeedSlot("s", channels=8, blend_gradient="detached"), SeedStage.BLENDING)
    h = torch.randn(2, 8, 4, 4, requires_grad=True)
    slot(h).sum().backward()
    # Detached seed input: the host sees only the direct (1 - a) path of the ADD blend.
    torch.testing.assert_close(h.grad, torch.full_like(h, 1 - slot.alpha), rtol=0, atol=1e-6)
    slot = drive(SeedSlot("s", channels=8, blend_gradient="detached"), SeedStage.HOLDING)
    h = torch.randn(2, 8, 4, 4, requires_grad=True)
    slot(h).sum().backward()
    # At alpha 1 the direct path has weight 0: the gradient reaching h flows through the seed.
    assert slot.alpha == 1.0 and h.grad.abs().sum() > 0


def test_identity_in_non_active_stages():
    h = torch.randn(2, 8, 3, 3)
    for stage in (SeedStage.DORMANT, SeedStage.GERMINATED, SeedStage.PRUNED,
                  SeedStage.EMBARGOED, SeedStage.RESETTING):
        slot = drive(SeedSlot("s", channels=8), stage)
        assert slot.stage == stage
        assert slot(h) is h


def test_scheduled_prune_freezes_seed_and_removes_it_at_zero():
    slot = drive(SeedSlot("s", channels=8), SeedStage.HOLDING)
    params = slot.seed_parameters()
    slot.schedule_prune(3, AlphaCurve.COSINE, reason="bad")
    assert slot.stage == SeedStage.BLENDING and slot.alpha_controller.mode == AlphaMode.DOWN
    assert not any(p.requires_grad for p in params)
    slot.tick()
    slot.tick()
    assert slot.seed is not None and 0 < slot.alpha < 1
    slot.tick()
    assert slot.stage == SeedStage.PRUNED and slot.seed is None
    assert slot.state.prune_reason == "bad"
    assert all(p.requires_grad for p in params)


def test_retarget_down_freezes_then_restores():
    slot = drive(SeedSlot("s", channels=8), SeedStage.HOLDING)
    slot.set_alpha_target(0.5, steps=2)
    assert slot.stage == SeedStage.BLENDING
    assert not any(p.requires_grad for p in slot.seed_parameters())
    slot.tick()
    slot.tick()
    assert slot.alpha == 0.5 and all(p.requires_grad for p in slot.seed_parameters())


def test_fossilized_seed_cannot_be_pruned():
    slot = drive(SeedSlot("s", channels=8), SeedStage.FOSSILIZED)
    with pytest.raises(IllegalTransitionError, match="stage is FOSSILIZED"):
        slot.prune("nope")
    assert slot.alpha == 1.0


def test_germinate_errors():
    with pytest.raises(RuntimeError, match="width unknown"):
        SeedSlot("s").germinate("norm")
    slot = SeedSlot("s", channels=4)
    with pytest.raises(ValueError, match="unknown blueprint 'nope'"):
        slot.germinate("nope")
    assert slot.state is None
    slot.germinate("norm")
    with pytest.raises(IllegalTransitionError, match="germinate into GERMINATED"):
        slot.germinate("norm")


def test_width_inferred_and_seed_follows_dtype():
    slot = SeedSlot("s").to(torch.float64)
    slot(torch.zeros(1, 6, 2, 2, dtype=torch.float64))
    assert slot.channels == 6
    slot.germinate("conv_small")
    assert all(p.dtype == torch.float64 for p in slot.seed_parameters())


def test_gradient_stats_measured():
    slot = drive(SeedSlot("s", channels=8), SeedStage.TRAINING)
    h = torch.randn(2, 8, 4, 4, requires_grad=True)
    slot(h).pow(2).mean().backward()
    slot.capture_gradient_stats(host_grad_norm=1.0, host_params=1000)
    m = slot.report().metrics
    assert m.gradient_health == 1.0 and m.has_exploding is False
    assert m.gradient_norm > 0 and m.gradient_ratio > 0
    for p in slot.seed_parameters():
        p.grad.fill_(1e6)
    slot.capture_gradient_stats()
    m = slot.report().metrics
    assert m.has_exploding is True and m.gradient_health == pytest.approx(0.2)


ALL_STAGES = [SeedStage.DORMANT, SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING,
              SeedStage.HOLDING, SeedStage.FOSSILIZED, SeedStage.PRUNED, SeedStage.EMBARGOED,
              SeedStage.RESETTING]


@pytest.mark.parametrize("stage", ALL_STAGES)
@pytest.mark.parametrize("algorithm", [AlphaAlgorithm.ADD, AlphaAlgorithm.GATE])
def test_state_dict_round_trip_in_every_stage(stage, algorithm):
    torch.manual_seed(1)
    slot = drive(SeedSlot("r0c1", channels=8), stage, algorithm=algorithm)
    state = slot.state_dict()
    fresh = SeedSlot("r0c1")  # no width, no seed: everything comes from the state dict
    fresh.load_state_dict(state)
    assert fresh.manifest() == slot.manifest()
    assert fresh.stage == stage
    restored = fresh.state_dict()
    assert restored.keys() == state.keys()
    for key in state:
        if key != "_extra_state":
            assert torch.equal(restored[key], state[key]), key
    h = torch.randn(2, 8, 4, 4)
    assert torch.equal(fresh(h), slot(h))
    assert [p.requires_grad for p in fresh.seed_parameters()] == [
        p.requires_grad for p in slot.seed_parameters()
    ]
    # Behaviour continues identically after the load.
    for s in (slot, fresh):
        s.tick()
    assert fresh.manifest() == slot.manifest()


def test_in_place_load_keeps_parameter_identity():
    slot = drive(SeedSlot("s", channels=8), SeedStage.HOLDING)
    snapshot = copy.deepcopy(slot.state_dict())
    ids = [id(p) for p in slot.seed_parameters()]
    with torch.no_grad():
        for p in slot.seed_parameters():
            p.add_(1.0)
    slot.load_state_dict(snapshot)
    assert [id(p) for p in slot.seed_parameters()] == ids
    assert torch.equal(slot.state_dict()[next(k for k in snapshot if "seed" in k)],
                       snapshot[next(k for k in snapshot if "seed" in k)])


def test_report_is_a_plain_snapshot():
    slot = drive(SeedSlot("s", channels=8), SeedStage.BLENDING)
    report = slot.report()
    slot.tick()
    assert report.alpha != slot.alpha
    assert report.stage == SeedStage.BLENDING and report.blueprint == "conv_light"
    assert report.history[-1].reason.startswith("G2")


def test_slot_checks_the_activation_rank_when_inferring_width():
    with pytest.raises(ValueError, match=r"^slot 's' \(cnn\) needs activations \[B, C, H, W\], "
                       r"got shape \(2, 8\)$"):
        SeedSlot("s")(torch.zeros(2, 8))


@pytest.mark.parametrize(("shape", "topology", "channels"),
                         [((2, 8, 4, 4), "cnn", 8), ((2, 5, 8), "transformer", 8),
                          ((2, 8), "linear", 8)])
def test_a_slot_without_a_topology_infers_it_from_the_activation_rank(shape, topology, channels):
    slot = SeedSlot("s", topology=None)
    h = torch.randn(shape)
    assert torch.equal(slot(h), h)
    assert (slot.topology, slot.channels) == (topology, channels)
    slot.germinate(available(topology)[0])  # a blueprint of the inferred topology
    assert slot.seed is not None


def test_a_slot_refuses_a_rank_it_cannot_infer_a_topology_from():
    with pytest.raises(ValueError, match=r"^slot 's' infers its topology from the rank of its "
                       r"activations; accepted ranks: 4 \(cnn\), 3 \(transformer\), 2 "
                       r"\(linear\), got shape \(5,\)$"):
        SeedSlot("s", topology=None)(torch.zeros(5))


def test_a_linear_slot_takes_tokens_one_by_one():
    slot = SeedSlot("s", topology="linear")
    slot(torch.zeros(2, 3, 6))
    assert slot.channels == 6
    drive(slot, SeedStage.BLENDING, "mlp", algorithm=AlphaAlgorithm.GATE)
    h = torch.randn(2, 3, 6)
    assert slot.gate(h).shape == (2, 3, 1) and slot(h).shape == h.shape


@pytest.mark.parametrize(("setting", "through"), [({}, True), ({"blend_gradient": "through"}, True),
                                                  ({"blend_gradient": "detached"}, False)])
def test_blend_gradient_says_whether_host_layers_learn_through_a_blending_seed(setting, through):
    # A detached blending seed starves the host layers before the slot: at alpha 1, until the
    # seed advances to HOLDING, they get no gradient at all (once the CNN default; the default
    # is now "through", measured better in docs/evidence.md).
    slot = drive(SeedSlot("s", channels=8, **setting), SeedStage.BLENDING)
    for _ in range(3):
        slot.tick()  # the ramp is over: alpha 1, still BLENDING until ADVANCE
    assert slot.stage == SeedStage.BLENDING and slot.alpha == 1.0
    h = torch.randn(2, 8, 4, 4, requires_grad=True)
    slot(h).sum().backward()
    assert bool(h.grad is not None and h.grad.abs().sum() > 0) == through
    restored = SeedSlot("s", channels=8, blend_gradient="detached" if through else "through")
    restored.load_state_dict(slot.state_dict())  # saved in the manifest
    assert restored.blend_gradient == slot.blend_gradient


@pytest.mark.parametrize(("topology", "legacy"), [("cnn", "detached"), ("transformer", "through")])
def test_a_manifest_from_before_the_setting_resumes_as_it_was_trained(topology, legacy):
    manifest = SeedSlot("s", channels=8, topology=topology).manifest()
    del manifest["blend_gradient"]  # written before the setting existed
    restored = SeedSlot("s", channels=8, topology=topology,
                        blend_gradient="detached" if legacy == "through" else "through")
    restored.load_manifest(manifest)
    assert restored.blend_gradient == legacy


def test_bad_blend_gradients_are_refused():
    with pytest.raises(ValueError, match=r"^unknown blend_gradient 'sideways'; accepted: "
                       r"detached, through$"):
        SeedSlot("s", blend_gradient="sideways")
    with pytest.raises(ValueError, match="unknown blend_gradient None"):
        SeedSlot("s", blend_gradient=None)  # type: ignore[arg-type]


def test_the_command_line_knows_the_same_blend_gradients():
    # The configuration lists them as plain data (parsing never imports torch).
    from esper_lightning.app.config import BLEND_GRADIENTS as CONFIG_BLEND_GRADIENTS
    from esper_lightning.core.slots import BLEND_GRADIENTS

    assert CONFIG_BLEND_GRADIENTS == BLEND_GRADIENTS


def test_an_empty_slot_takes_a_new_width_and_a_seeded_one_refuses():
    slot = SeedSlot("r0c1", channels=16)
    slot.resize(32)
    assert slot.channels == 32
    with pytest.raises(ValueError, match="channels must be an int >= 1, got 0"):
        slot.resize(0)
    slot.germinate("conv_light")
    with pytest.raises(ValueError, match="holds a seed of width 32; accepted: resizing an empty"):
        slot.resize(64)
    assert slot.channels == 32
