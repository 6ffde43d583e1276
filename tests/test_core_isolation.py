"""A diverging seed never touches the host: the incubator's forward is the host's own bit for
bit whatever the seed computes, and `MorphogenesisEngine.prune_nonfinite` prunes a seed whose
output or gradients are inf or NaN before the optimizer steps (reason ``seed_nonfinite``),
dropping the step when a seed in the host's forward spoiled the host's gradients."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from esper_lightning import blueprints
from esper_lightning.blueprints.growth import operator_of
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.engine import SEED_NONFINITE, MorphogenesisEngine
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.optim import seed_group_names
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot
from esper_lightning.hosts import GPT_PRESETS, GPTHost

#: The activation each topology's slot sees in these tests, and the host's input.
WIDTH = 16
INPUTS: dict[str, tuple[int, ...]] = {"cnn": (4, 3, 6, 6), "transformer": (2, 5, 12),
                                      "linear": (4, 12)}
TARGETS: dict[str, tuple[int, ...]] = {"cnn": (4, 4, 6, 6), "transformer": (2, 5, 4),
                                       "linear": (4, 4)}
#: Every blueprint that incubates (growth seeds blend at once: `test_growth_seeds_...`).
INCUBATING = [(topology, name) for topology in blueprints.TOPOLOGIES
              for name in blueprints.available(topology) if operator_of(name) is None]
GROWTH = [name for name in blueprints.available("transformer") if operator_of(name) is not None]
POISONS = ("inf_output", "nan_output", "inf_grad", "nan_grad")


class _SpoilGradient(torch.autograd.Function):
    """The identity forward; a backward of ``value`` everywhere (a seed whose backward
    diverges while its output is finite)."""

    @staticmethod
    def forward(ctx, s: Tensor, value: float) -> Tensor:
        ctx.value = value
        return s.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return torch.full_like(grad, ctx.value), None


def poison(seed: nn.Module, kind: str) -> None:
    """Make ``seed``'s output (``*_output``: ``+inf`` keeps its gradients finite, ``*nan``
    spoils them too) or its gradients (``*_grad``) inf or NaN from now on."""
    def hook(module: nn.Module, args: tuple[Tensor, ...], out: Tensor) -> Tensor:
        if kind == "inf_output":
            return out + float("inf")
        if kind == "nan_output":
            return out * float("nan")
        return _SpoilGradient.apply(out, float("inf" if kind == "inf_grad" else "nan"))

    seed.register_forward_hook(hook)


class Host(nn.Module):
    """in → slot → ReLU(inplace) → out: the in-place op after the slot is what a user's CNN
    does, and what a view returned by the incubator would refuse."""

    def __init__(self, topology: str, slot: SeedSlot | None = None) -> None:
        super().__init__()
        if topology == "cnn":
            self.inp, self.out = nn.Conv2d(3, WIDTH, 3, padding=1), nn.Conv2d(WIDTH, 4, 1)
        else:
            self.inp, self.out = nn.Linear(12, WIDTH), nn.Linear(WIDTH, 4)
        self.slot = slot if slot is not None else SeedSlot("s", WIDTH, topology)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.act(self.slot(self.inp(x))))


def _host(topology: str, rng_seed: int = 0) -> Host:
    torch.manual_seed(rng_seed)
    return Host(topology)


def _batch(topology: str, rng_seed: int = 1) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(rng_seed)
    return (torch.randn(INPUTS[topology], generator=generator),
            torch.randn(TARGETS[topology], generator=generator))


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _engine(model: nn.Module, blueprint: str, stage: SeedStage,
            **kwargs) -> tuple[MorphogenesisEngine, torch.optim.Optimizer]:
    """An engine on ``model`` with an SGD attached and a seed of ``blueprint`` in its first
    slot, moved to TRAINING or (one decision later, mid-ramp) BLENDING."""
    seeding = SeedingConfig(gate_config=GateConfig(min_training_epochs=1), **kwargs)
    engine = MorphogenesisEngine(model, seeding=seeding, rng_seed=0)
    optimizer = _sgd(model)
    engine.attach_optimizer(optimizer)
    outcome = engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint=blueprint))
    assert outcome.success, outcome.reason
    slot = next(iter(engine.slots.values()))
    if slot.stage == SeedStage.GERMINATED:
        assert engine.execute(Action(LifecycleOp.ADVANCE, 0)).success
    if stage == SeedStage.BLENDING and slot.stage == SeedStage.TRAINING:
        engine.tick()
        slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
        assert engine.execute(Action(LifecycleOp.ADVANCE, 0)).success
    engine.tick()  # the decision ends: a blend ramp moves past alpha 0
    assert slot.stage == stage
    return engine, optimizer


def _host_grads(model: nn.Module) -> dict[str, Tensor | None]:
    return {n: p.grad for n, p in model.named_parameters() if not n.startswith("slot.seed")}


def _loss(out: Tensor, target: Tensor) -> Tensor:
    return F.mse_loss(out, target)


@pytest.mark.parametrize("kind", POISONS)
@pytest.mark.parametrize(("topology", "blueprint"), INCUBATING)
def test_an_incubating_nonfinite_seed_leaves_the_host_bitwise_its_own_and_is_pruned(
        topology: str, blueprint: str, kind: str):
    plain = _host(topology)
    grown = copy.deepcopy(plain)
    engine, optimizer = _engine(grown, blueprint, SeedStage.TRAINING)
    slot = engine.slots["s"]
    poison(slot.seed, kind)
    plain_optimizer = _sgd(plain)
    x, target = _batch(topology)
    outputs = []
    for model in (plain, grown):
        out = model(x)
        _loss(out, target).backward()
        outputs.append(out)
    assert torch.equal(outputs[0], outputs[1])
    seed_grads = [p.grad for p in slot.seed_parameters()]
    if kind != "inf_output":  # +inf output: gradients finite, caught by the output flag
        assert not all(torch.isfinite(g).all() for g in seed_grads if g is not None)
    plain_grads = dict(plain.named_parameters())
    for name, grad in _host_grads(grown).items():
        assert torch.equal(grad, plain_grads[name].grad), name

    assert engine.prune_nonfinite() == ["s"]
    assert slot.stage == SeedStage.PRUNED and slot.state.prune_reason == SEED_NONFINITE
    event = engine.events[-1]
    assert (event.slot_id, event.kind, event.blueprint, event.reason) == (
        "s", "pruned", blueprint, SEED_NONFINITE)
    assert seed_group_names(optimizer) == []
    # An incubating seed spoils nothing of the host's: its step goes on, bitwise the plain one.
    assert engine.dropped_steps == 0
    for opt in (plain_optimizer, optimizer):
        opt.step()
        opt.zero_grad()
    for (name, p), q in zip(grown.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert engine.prune_nonfinite() == []  # nothing live: nothing to read


@pytest.mark.parametrize("kind", POISONS)
@pytest.mark.parametrize("blend_gradient", ["through", "detached"])
@pytest.mark.parametrize(("topology", "blueprint"),
                         [("cnn", "conv_light"), ("transformer", "attention"),
                          ("linear", "mlp_small")])
def test_a_blending_nonfinite_seed_is_pruned_and_its_step_dropped(
        topology: str, blueprint: str, blend_gradient: str, kind: str,
        caplog: pytest.LogCaptureFixture):
    model = _host(topology)
    engine, optimizer = _engine(model, blueprint, SeedStage.BLENDING,
                                blend_gradient=blend_gradient)
    slot = engine.slots["s"]
    assert 0.0 < slot.alpha < 1.0
    for _ in range(2):  # momentum buffers of the host's before the spoiled step
        _loss(model(_batch(topology)[0]), _batch(topology)[1]).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert engine.prune_nonfinite() == []
    before = {n: p.detach().clone() for n, p in model.named_parameters()
              if not n.startswith("slot.")}
    moments = {id(p): optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()
               if not any(p is q for q in slot.seed_parameters())}
    poison(slot.seed, kind)
    x, target = _batch(topology, rng_seed=2)
    _loss(model(x), target).backward()
    host_spoiled = not all(torch.isfinite(g).all() for g in _host_grads(model).values()
                           if g is not None)
    with caplog.at_level(logging.WARNING, logger="esper_lightning.core.engine"):
        assert engine.prune_nonfinite() == ["s"]
    assert slot.state.prune_reason == SEED_NONFINITE and seed_group_names(optimizer) == []
    assert engine.dropped_steps == int(host_spoiled)
    if host_spoiled:
        assert all(p.grad is None for p in model.parameters())
        assert "the step's gradients were dropped" in caplog.text
    optimizer.step()
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name
        if host_spoiled:  # neither the weights nor the momentum moved
            assert torch.equal(p, before[name]), name
            assert torch.equal(optimizer.state[p]["momentum_buffer"], moments[id(p)]), name


@pytest.mark.parametrize("kind", POISONS)
@pytest.mark.parametrize("blueprint", GROWTH)
def test_growth_seeds_blend_at_once_and_a_nonfinite_one_drops_the_step(blueprint: str,
                                                                        kind: str):
    torch.manual_seed(0)
    host = GPTHost("grow2", slots=GPT_PRESETS["grow2"].growth_slot_ids)
    engine = MorphogenesisEngine(host, rng_seed=0)
    idx = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    host(idx)  # the slots learn their width
    optimizer = _sgd(host)
    engine.attach_optimizer(optimizer)
    assert engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint=blueprint)).success
    engine.tick()
    slot = engine.slots["r1c0"]
    assert slot.stage == SeedStage.BLENDING and slot.alpha > 0.0
    poison(slot.seed, kind)
    before = {n: p.detach().clone() for n, p in host.named_parameters()
              if not n.startswith("slots.")}
    logits = host(idx)
    F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
    assert engine.prune_nonfinite() == ["r1c0"]
    assert slot.state.prune_reason == SEED_NONFINITE
    spoiled = engine.dropped_steps == 1
    # +inf through a block's LayerNorm, a NaN, or a NaN gradient reaching the host: all spoil it
    assert spoiled and all(p.grad is None for p in host.parameters())
    optimizer.step()
    for name, p in host.named_parameters():
        assert torch.equal(p, before[name]), name


@pytest.mark.parametrize(("stage", "layer"), [(SeedStage.TRAINING, "out"),
                                             (SeedStage.TRAINING, "inp"),
                                             (SeedStage.BLENDING, "inp")])
def test_a_host_that_diverges_on_its_own_is_the_governors_not_the_seeds(stage: SeedStage,
                                                                       layer: str):
    """A NaN host weight after an incubating seed (its gradients inherit the NaN) or before
    any seed (its input is NaN) prunes nothing and drops nothing."""
    model = _host("cnn")
    engine, _ = _engine(model, "conv_light", stage)
    x, target = _batch("cnn")
    with torch.no_grad():
        getattr(model, layer).weight[0, 0] = float("nan")
    _loss(model(x), target).backward()
    seed_grads = [p.grad for p in engine.slots["s"].seed_parameters()]
    assert any(not torch.isfinite(g).all() for g in seed_grads)  # inherited from the host
    assert engine.prune_nonfinite() == []
    assert engine.slots["s"].stage == stage and engine.dropped_steps == 0
    assert model.out.weight.grad is not None  # nothing dropped: the governor decides


def test_a_nonfinite_host_without_a_live_seed_is_left_alone():
    model = _host("linear")
    engine = MorphogenesisEngine(model)
    engine.attach_optimizer(_sgd(model))
    x, target = _batch("linear")
    model(x)
    with torch.no_grad():
        model.inp.bias.fill_(float("inf"))
    _loss(model(x), target).backward()
    assert engine.prune_nonfinite() == [] and engine.events == []
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("stage", [SeedStage.TRAINING, SeedStage.BLENDING])
def test_under_a_loss_scaler_an_overflow_of_host_and_seed_prunes_nothing(stage: SeedStage):
    model = _host("cnn")
    engine, _ = _engine(model, "conv_small", stage)
    x, target = _batch("cnn")
    poison(engine.slots["s"].seed, "inf_grad")
    _loss(model(x), target).backward()
    with torch.no_grad():
        model.inp.weight.grad[0, 0, 0, 0] = float("inf")  # the scaler's overflow hits the host
    assert engine.prune_nonfinite(scaled=True) == []
    # The scaler skips the step itself: nothing was dropped, the seed lives on.
    assert engine.dropped_steps == 0 and engine.slots["s"].stage == stage
    assert model.inp.weight.grad is not None


@pytest.mark.parametrize("kind", ["inf_output", "nan_grad"])
def test_under_a_loss_scaler_a_seed_only_nonfinite_step_prunes_the_seed(kind: str):
    model = _host("cnn")
    engine, _ = _engine(model, "conv_small", SeedStage.TRAINING)
    poison(engine.slots["s"].seed, kind)
    x, target = _batch("cnn")
    _loss(model(x), target).backward()
    assert engine.prune_nonfinite(scaled=True) == ["s"]


def test_the_decision_is_reduced_over_the_ranks():
    """A seed's output differs by rank: the flags are summed (``reduce``) before anyone reads
    them, so a rank whose own seed was finite prunes with the others."""
    model = _host("linear")
    engine, _ = _engine(model, "mlp_small", SeedStage.TRAINING)
    x, target = _batch("linear")
    _loss(model(x), target).backward()  # finite here
    seen: list[Tensor] = []

    def other_rank_saw_inf(flags: Tensor) -> Tensor:
        seen.append(flags.clone())
        # [output, input, gradients]: its output was inf
        return flags + torch.tensor([1.0, 0.0, 0.0], device=flags.device)

    assert engine.prune_nonfinite(reduce=other_rank_saw_inf) == ["s"]
    assert len(seen) == 1 and seen[0].tolist() == [0.0, 0.0, 0.0]


def test_validation_forwards_raise_no_flag_and_a_flag_is_read_once():
    model = _host("cnn")
    engine, _ = _engine(model, "norm", SeedStage.TRAINING)
    slot = engine.slots["s"]
    poison(slot.seed, "inf_output")
    x, _ = _batch("cnn")
    with torch.no_grad():
        model(x)  # validation: the seed's output never reaches the host; no flag
    assert slot.take_nonfinite() is None
    model(x)
    flags = slot.take_nonfinite()
    assert flags is not None and flags.tolist() == [True, False]  # [output, input]
    assert slot.take_nonfinite() is None


def test_the_incubator_returns_a_tensor_of_its_own_and_refuses_another_shape():
    slot = SeedSlot("s", WIDTH, "linear")
    h = torch.randn(3, WIDTH, requires_grad=True)
    slot(h.detach())
    slot.germinate("mlp_small")
    slot.advance()
    out = slot(h)
    assert torch.equal(out, h) and out.data_ptr() != h.data_ptr()
    slot.seed.register_forward_hook(lambda m, a, o: o[:, :-1])
    with pytest.raises(RuntimeError, match=r"^slot 's': seed output shape \(3, 15\) != "
                                           r"activation shape \(3, 16\)$"):
        slot(h)



def test_a_dropped_step_puts_back_the_buffers_its_forward_spoiled():
    """A BatchNorm after a blending slot updates its running statistics from the NaN output
    in the same forward: the dropped step puts them back as they were when the slot ran."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, WIDTH, 3, padding=1), nn.BatchNorm2d(WIDTH),
                          SeedSlot("s", WIDTH, "cnn"), nn.BatchNorm2d(WIDTH), nn.ReLU(),
                          nn.Conv2d(WIDTH, 4, 1))
    engine, optimizer = _engine(model, "conv_light", SeedStage.BLENDING)
    x, target = _batch("cnn")
    _loss(model(x), target).backward()  # a healthy blending step
    assert engine.prune_nonfinite() == []
    optimizer.step()
    optimizer.zero_grad()
    before = {n: b.clone() for n, b in model.named_buffers()}
    poison(engine.slots["s"].seed, "nan_output")
    _loss(model(x), target).backward()
    assert model[3].running_mean.isnan().all()  # spoiled by the forward
    assert engine.prune_nonfinite() == ["s"] and engine.dropped_steps == 1
    for name, value in model.named_buffers():
        if name.startswith("3."):  # after the slot: back as they were
            assert torch.equal(value, before[name]), name
        else:  # before it: this forward's update from the host's own activations stays
            assert torch.isfinite(value.float()).all(), name
    assert not torch.equal(model[1].running_mean, before["1.running_mean"])
