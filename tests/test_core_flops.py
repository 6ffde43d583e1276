"""`core.flops.FlopMeter`: counts equal to the analytic ones, cached per architecture, and
metering that leaves training bitwise unchanged."""

import pytest
import torch
from torch import nn

from esper_lightning.blueprints.block import Block
from esper_lightning.core.counterfactual import evaluate, make_plan
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.flops import FlopMeter, host_structure, live_slots, structure
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot
from esper_lightning.hosts.gpt import GPTHost
from esper_lightning.hosts.presets import GPTConfig

B, T, D, V = 4, 16, 32, 256


def gpt_step_flops(layers: int) -> int:
    """Training FLOPs of one batch of the GPT host, by hand: per token and layer the four
    Linear layers (3D² + D² + 4D² + 4D² = 12D² multiply-adds), the tied head (DV), attention's
    two batched products over the full T×T square (4·B·T²·D per layer forward); the backward
    costs twice the forward (every matrix product's input needs a gradient: the embedding
    comes first)."""
    forward = 2 * B * T * (12 * D * D * layers + D * V) + 4 * B * T * T * D * layers
    return 3 * forward


def test_linear_layers_count_their_multiply_adds():
    meter = FlopMeter()
    x = torch.zeros(B, 64)
    # First layer: the forward's 2·B·in·out and the weight gradient's as much (the input
    # needs no gradient).
    assert meter.training_step(nn.Linear(64, 32), x) == 2 * (2 * B * 64 * 32)
    # Behind another layer its input gradient costs as much again.
    two = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 16))
    assert meter.training_step(two, x) == 2 * (2 * B * 64 * 32) + 3 * (2 * B * 32 * 16)
    assert meter.forward(nn.Linear(64, 32).eval(), x) == 2 * B * 64 * 32


@pytest.mark.parametrize("layers", [1, 4])
def test_gpt_host_counts_attention_like_the_hand_count(layers):
    host = GPTHost(GPTConfig(block_size=T, n_layer=layers, n_head=4, n_embd=D), slots=[])
    assert FlopMeter().training_step(host, torch.zeros(B, T, dtype=torch.long)) == (
        gpt_step_flops(layers))


def test_one_transformer_block_with_its_attention():
    block = Block(D, n_head=4)
    forward = 2 * B * T * 12 * D * D + 4 * B * T * T * D  # attention: Q Kᵀ and A V
    assert FlopMeter().training_step(block, torch.zeros(B, T, D)) == 3 * forward


def _host_with_seed(stage: str) -> tuple[GPTHost, MorphogenesisEngine]:
    torch.manual_seed(0)
    host = GPTHost(GPTConfig(block_size=T, n_layer=1, n_head=4, n_embd=D), slots=["r0c0"])
    engine = MorphogenesisEngine(
        host, seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=0)))
    slot = engine.slots["r0c0"]
    slot.germinate("lora")
    for _ in range(("GERMINATED", "TRAINING", "BLENDING").index(stage)):
        _advance(slot)
    assert slot.stage.name == stage
    return host, engine


def _advance(slot: SeedSlot) -> None:
    """Advance past a gate that wants measured, healthy gradients (none are measured here)."""
    assert slot.state is not None
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    assert slot.advance().passed


def test_an_incubating_seed_adds_its_own_forward_and_backward():
    meter = FlopMeter()
    tokens = torch.zeros(B, T, dtype=torch.long)
    host, engine = _host_with_seed("TRAINING")
    bare = meter.training_step(host, tokens)  # the slot alone: no seed yet...
    seed = engine.slots["r0c0"].seed
    assert seed is not None
    # ...counted the seed: its input is detached, so it costs what it costs on a leaf input.
    alone = meter.training_step(seed, torch.zeros(B, T, D))
    germinated, _ = _host_with_seed("GERMINATED")  # a seed that does not run yet costs nothing
    assert meter.training_step(germinated, tokens) == gpt_step_flops(1)
    assert alone > 0 and bare == gpt_step_flops(1) + alone


def test_the_host_step_is_the_step_with_its_live_seeds_off_and_leaves_them_in_place():
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(4))
    host, engine = _host_with_seed("BLENDING")
    slot = engine.slots["r0c0"]
    seed, before = slot.seed, host(tokens)
    empty = GPTHost(GPTConfig(block_size=T, n_layer=1, n_head=4, n_embd=D), slots=["r0c0"])
    assert live_slots(host) == [slot] and live_slots(empty) == []
    # Signed as the host before its germination: that host's measurement serves both.
    assert host_structure(host) == structure(empty) != structure(host)
    meter = FlopMeter()
    assert meter.host_step(host, tokens) == meter.training_step(empty, tokens) == (
        gpt_step_flops(1))
    assert meter.measurements == 1
    assert meter.training_step(host, tokens) > gpt_step_flops(1)
    assert slot.seed is seed is not None  # put back, and still the model's
    assert {id(p) for p in seed.parameters()} <= {id(p) for p in host.parameters()}
    assert torch.equal(host(tokens), before)
    arch = structure(empty)
    assert host_structure(empty, arch) is arch  # no live seed: the whole model, as given


def test_each_architecture_is_measured_once_and_stage_changes_measure_again():
    meter = FlopMeter()
    tokens = torch.zeros(B, T, dtype=torch.long)
    host, engine = _host_with_seed("TRAINING")
    first = meter.training_step(host, tokens)
    assert meter.training_step(host, tokens) == first
    assert meter.measurements == 1
    _advance(engine.slots["r0c0"])  # BLENDING: the seed's input is no longer detached
    blending = meter.training_step(host, tokens)
    assert meter.measurements == 2 and blending > first
    engine.slots["r0c0"].tick()  # alpha moves; the graph does not
    assert meter.training_step(host, tokens) == blending
    assert meter.measurements == 2
    meter.training_step(host, torch.zeros(2 * B, T, dtype=torch.long))
    assert meter.measurements == 3  # another batch shape


def test_a_blended_seed_holding_or_fossilized_costs_no_new_measurement():
    meter = FlopMeter()
    tokens = torch.zeros(B, T, dtype=torch.long)
    host, engine = _host_with_seed("BLENDING")
    slot = engine.slots["r0c0"]
    blending = meter.training_step(host, tokens)
    host.eval()
    forward = meter.forward(host, tokens)
    host.train()
    while slot.alpha < 1.0:
        slot.tick()
    assert slot.advance().passed and slot.stage.name == "HOLDING"
    assert slot.state is not None
    slot.state.metrics.counterfactual_contribution = 1.0  # G5 wants a measured contribution
    assert slot.fossilize().passed and slot.stage.name == "FOSSILIZED"
    # The same matrix products as while blending (only elementwise work differs): cached.
    assert meter.training_step(host, tokens) == blending
    host.eval()
    assert meter.forward(host, tokens) == forward
    assert meter.measurements == 2
    assert FlopMeter().training_step(host.train(), tokens) == blending  # measured afresh: equal


def test_counterfactual_counts_each_configuration():
    meter = FlopMeter()
    host, engine = _host_with_seed("BLENDING")
    engine.slots["r0c0"].tick()  # alpha > 0: the slot is measured
    host.eval()
    tokens = torch.zeros(B, T, dtype=torch.long)
    plan = make_plan(engine.slots)
    assert plan.configs == ("main", "off:r0c0")
    one = meter.forward(host, tokens)
    assert meter.counterfactual(host, tokens, engine.slots, plan, "separate") == 2 * one
    assert meter.measurements == 1  # a blending slot's configurations: forwards, not measured
    # Measured the long way (both configurations on meta tensors), the count is the same.
    long_way = meter._measure(host, tokens, lambda m, xm: evaluate(
        m, xm, engine.slots, plan, "separate"), backward=False)
    assert long_way == 2 * one


def _train(host: nn.Module, steps: int, meter: FlopMeter | None) -> list[torch.Tensor]:
    optimizer = torch.optim.AdamW(host.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, V, (B, T), generator=generator)
        if meter is not None:
            meter.training_step(host, x)
        optimizer.zero_grad()
        logits = host(x)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten())
        loss.backward()
        optimizer.step()
    return [p.detach().clone() for p in host.parameters()]


def test_metering_leaves_training_bitwise_unchanged():
    # Dropout draws from the global generator: a measurement that drew too would shift it.
    config = GPTConfig(block_size=T, n_layer=2, n_head=4, n_embd=D, dropout=0.1)
    runs = []
    for meter in (None, FlopMeter()):
        torch.manual_seed(0)
        host = GPTHost(config, slots=[])
        runs.append((_train(host, 3, meter), torch.get_rng_state()))
    (plain, plain_rng), (metered, metered_rng) = runs
    assert all(torch.equal(a, b) for a, b in zip(plain, metered, strict=True))
    assert torch.equal(plain_rng, metered_rng)


def test_a_module_that_cannot_run_on_meta_tensors_fails_loudly():
    class ReadsItsInput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x) * float(x.sum().item() > 0)

    with pytest.raises(Exception, match="meta"):
        FlopMeter().training_step(ReadsItsInput(), torch.ones(2, 4))
