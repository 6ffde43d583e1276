"""export(): a grown model becomes a plain torch module that computes the same thing."""

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from fresh_process import outputs_elsewhere
from helpers import TinyHost, UserNet
from torch import nn

from esper_lightning.blueprints import available
from esper_lightning.core import MorphogenesisEngine, SeedSlot, SeedStage
from esper_lightning.core.alpha import AlphaAlgorithm
from esper_lightning.core.exporter import FossilBlend, export
from esper_lightning.hosts import CifarCNNHost, GPTHost

IDENTITY_STAGES = [SeedStage.DORMANT, SeedStage.GERMINATED, SeedStage.PRUNED,
                   SeedStage.EMBARGOED, SeedStage.RESETTING]
LIVE_STAGES = [SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING]
#: Epochs after a prune at which the slot is in each failure stage.
FAILURE_TICKS = {SeedStage.PRUNED: 0, SeedStage.EMBARGOED: 1, SeedStage.RESETTING: 6}


def grow(slot: SeedSlot, stage: SeedStage, blueprint: str = "conv_light",
         algorithm: AlphaAlgorithm = AlphaAlgorithm.ADD) -> SeedSlot:
    """Move an empty slot to ``stage`` with the slot API, then make its seed far from identity."""
    if stage == SeedStage.DORMANT:
        return slot
    slot.germinate(blueprint, algorithm=algorithm, tempo=2)
    if stage in FAILURE_TICKS:
        slot.prune("test")
        for _ in range(FAILURE_TICKS[stage]):
            slot.tick()
    elif stage != SeedStage.GERMINATED:
        _advance_to(slot, stage)
    assert slot.stage == stage
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for p in slot.seed_parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    return slot


def _advance_to(slot: SeedSlot, stage: SeedStage) -> None:
    assert slot.advance().passed  # TRAINING
    if stage == SeedStage.TRAINING:
        return
    for _ in range(slot.gates.config.min_training_epochs):
        slot.tick()
    metrics = slot.state.metrics
    metrics.gradient_health, metrics.has_exploding = 1.0, False
    assert slot.advance().passed  # BLENDING at alpha 0
    slot.tick()  # alpha 0.5 of the 2-epoch ramp
    if stage == SeedStage.BLENDING:
        return
    slot.tick()
    assert slot.advance().passed  # HOLDING at alpha 1
    if stage == SeedStage.FOSSILIZED:
        slot.record_contribution(1.0)
        assert slot.fossilize().passed


def cifar_host(stage: SeedStage, blueprint: str = "conv_light",
               algorithm: AlphaAlgorithm = AlphaAlgorithm.ADD) -> CifarCNNHost:
    torch.manual_seed(0)
    host = CifarCNNHost("baseline", slots=["r0c1"])
    with torch.no_grad():
        host(torch.randn(8, 3, 16, 16))  # non-trivial BatchNorm running statistics
    grow(host.slots["r0c1"], stage, blueprint, algorithm)
    return host.eval()


def without_seed(model: nn.Module, slot: SeedSlot, x: torch.Tensor) -> torch.Tensor:
    with slot.alpha_override(torch.zeros(x.shape[0])):
        return model(x)


class Branches(nn.Module):
    """conv(3→16), then one slot per name side by side on its output, stacked: (B, n, 16, H, W).
    Each seed has a branch of its own, so a wrong fold of one shows in its own slice and no
    other seed downstream can undo it (a norm blueprint after it would)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.slots = nn.ModuleDict({name: SeedSlot(name, channels=16) for name in names})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        return torch.stack([slot(h) for slot in self.slots.values()], dim=1)


@dataclasses.dataclass
class Folded:
    """Every CNN blueprint fossilized with one blend, side by side, and its export."""

    host: Branches
    x: torch.Tensor
    expected: torch.Tensor
    shipped: nn.Module


@pytest.fixture(scope="module")
def folded() -> dict[AlphaAlgorithm, Folded]:
    """Per blend, one host holding a fossil of every CNN blueprint and one export of it: the
    trace costs a fraction of a second per seed, and the 24 cases would pay it 24 times."""
    made = {}
    for algorithm in AlphaAlgorithm:
        torch.manual_seed(0)
        host = Branches(available("cnn"))
        for blueprint, slot in host.slots.items():
            grow(slot, SeedStage.FOSSILIZED, blueprint, algorithm)
        host.eval()
        x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(2))
        made[algorithm] = Folded(host, x, host(x), export(host, x))
    return made


@pytest.mark.parametrize("algorithm", list(AlphaAlgorithm), ids=lambda a: a.name)
@pytest.mark.parametrize("blueprint", available("cnn"))
def test_fossil_is_folded_in_for_every_blueprint_and_blend(folded, blueprint, algorithm):
    host, x, shipped = folded[algorithm].host, folded[algorithm].x, folded[algorithm].shipped
    branch = list(host.slots).index(blueprint)
    slot = host.slots[blueprint]
    expected = folded[algorithm].expected[:, branch]
    assert (expected - without_seed(host, slot, x)[:, branch]).abs().max() > 1e-3
    there = shipped(x)[:, branch]
    if algorithm == AlphaAlgorithm.ADD:  # folded to s instead of h + 1 * (s - h)
        torch.testing.assert_close(there, expected, rtol=0, atol=1e-5)
    else:  # the blend formula, operation for operation
        assert torch.equal(there, expected)
    names = dict(shipped.named_parameters())
    seed_names = {f"slots.{blueprint}.{n}" for n, _ in slot.named_parameters()}
    assert seed_names and seed_names <= names.keys()
    assert any(n.startswith(f"slots.{blueprint}.gate.") for n in names) == (
        algorithm == AlphaAlgorithm.GATE)


def _assert_plain_torch(module: nn.Module) -> None:
    for name, sub in module.named_modules():
        assert not type(sub).__module__.startswith("esper_lightning"), (name, type(sub))
        for hooks in (sub._forward_hooks, sub._forward_pre_hooks):
            for hook in hooks.values():
                owner = getattr(hook, "__module__", None) or type(hook).__module__
                assert not owner.startswith("esper_lightning"), (name, hook)
    for node in module.graph.nodes:
        assert node.op in ("placeholder", "get_attr", "call_function", "call_module", "output")
        if node.op == "call_function":
            owner = getattr(node.target, "__module__", None) or type(node.target).__module__
            assert owner.startswith(("torch", "_operator", "builtins")), node.target


def test_export_is_plain_torch_and_re_exports():
    host = cifar_host(SeedStage.FOSSILIZED, "bottleneck", AlphaAlgorithm.GATE)
    shipped = export(host, torch.randn(2, 3, 16, 16))
    assert isinstance(shipped, torch.fx.GraphModule)
    _assert_plain_torch(shipped)
    x = torch.randn(7, 3, 16, 16)  # the batch dimension stays dynamic
    expected = host(x)
    assert torch.equal(shipped(x), expected)
    again = torch.export.export(shipped, (x,)).module()
    assert torch.equal(again(x), expected)


#: Batch sizes the shipped file must run, none of them the example's.
SHIPPED_BATCHES = (1, 3, 17)


@dataclasses.dataclass
class Shipped:
    """A grown host exported to ``path``, its module, the batches it must run and what the
    host computes on them, and what the file computes on them in a fresh process."""

    host: nn.Module
    path: Path
    module: nn.Module
    inputs: list[torch.Tensor]
    expected: list[torch.Tensor]
    there: list[torch.Tensor] = dataclasses.field(default_factory=list)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Shipped]:
    """A grown CNN and a grown GPT saved as ``.pt2`` files (each in its own folder) and run
    in one fresh process without the package (a launch is seconds of importing torch)."""
    cnn = cifar_host(SeedStage.FOSSILIZED, "bottleneck", AlphaAlgorithm.GATE)
    generator = torch.Generator().manual_seed(3)
    path = tmp_path_factory.mktemp("cnn") / "grown.pt2"
    module = export(cnn, torch.randn(4, 3, 16, 16, generator=generator), path=path)
    inputs = [torch.randn(b, 3, 16, 16, generator=generator) for b in SHIPPED_BATCHES]
    programs = {"cnn": Shipped(cnn, path, module, inputs, [cnn(x) for x in inputs])}
    torch.manual_seed(0)
    gpt = GPTHost("tiny", slots=["r0c0", "r0c1"])
    grow(gpt.slots["r0c1"], SeedStage.FOSSILIZED, available("transformer")[0])
    gpt.eval()
    generator = torch.Generator().manual_seed(4)
    tokens = [torch.randint(0, 256, (b, 24), generator=generator) for b in (2, *SHIPPED_BATCHES)]
    path = tmp_path_factory.mktemp("gpt") / "gpt.pt2"
    module = export(gpt, tokens[0], path=path)  # the sequence length stays 24, the batch dynamic
    programs["gpt"] = Shipped(gpt, path, module, tokens[1:], [gpt(x) for x in tokens[1:]])
    found = outputs_elsewhere([(p.path, p.inputs) for p in programs.values()])
    for program, there in zip(programs.values(), found, strict=True):
        program.there = there
    return programs


def test_saved_cnn_program_runs_any_batch_without_the_package(shipped):
    cnn = shipped["cnn"]
    slot = cnn.host.slots["r0c1"]
    assert (cnn.expected[0] - without_seed(cnn.host, slot, cnn.inputs[0])).abs().max() > 1e-3
    for x, y, there in zip(cnn.inputs, cnn.expected, cnn.there, strict=True):
        assert there.shape == (x.shape[0], 10)
        torch.testing.assert_close(there, y, rtol=1e-5, atol=1e-6)
        assert torch.equal(cnn.module(x), y)
    assert sorted(p.name for p in cnn.path.parent.iterdir() if "pt2" in p.name) == ["grown.pt2"]


def test_saved_gpt_program_runs_any_batch_without_the_package(shipped):
    gpt = shipped["gpt"]
    slot = gpt.host.slots["r0c1"]
    assert (gpt.expected[1] - without_seed(gpt.host, slot, gpt.inputs[1])).abs().max() > 1e-3
    for x, y, there in zip(gpt.inputs, gpt.expected, gpt.there, strict=True):
        assert there.shape == (x.shape[0], 24, 256)
        torch.testing.assert_close(there, y, rtol=1e-5, atol=1e-5)


def test_a_refused_export_leaves_an_existing_file(tmp_path):
    path = tmp_path / "model.pt2"
    path.write_bytes(b"an earlier export")
    with pytest.raises(ValueError, match="holds a live seed"):
        export(cifar_host(SeedStage.BLENDING), torch.randn(2, 3, 16, 16), path=path)
    assert path.read_bytes() == b"an earlier export"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt2"]


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_saving_writes_through_a_pt2_file_torch_does_not_warn_about(tmp_path):
    # The temporary file was ".model.pt2.partial": torch.export.save logged a warning at every
    # export (on its own logger, which does not propagate to pytest's).
    kept, logger = _Kept(), logging.getLogger("torch.export.pt2_archive._package")
    logger.addHandler(kept)
    try:
        for name in ("model.pt2", "model.pt"):  # a name of the user's own, too
            export(nn.Sequential(nn.Linear(3, 2)), torch.zeros(2, 3), path=tmp_path / name)
    finally:
        logger.removeHandler(kept)
    assert not [m for m in kept.messages if "archive file" in m]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "model.pt2"]


def test_injected_slots_fossil_and_pruned():
    torch.manual_seed(0)
    model = UserNet()
    engine = MorphogenesisEngine(model, slots=["net.1", "net.4"])
    model(torch.zeros(1, 3, 8, 8))  # infers the slot widths
    grow(engine.slots["net.1"], SeedStage.FOSSILIZED, "conv_small", AlphaAlgorithm.MULTIPLY)
    grow(engine.slots["net.4"], SeedStage.PRUNED)
    model.eval()
    x = torch.randn(3, 3, 8, 8)
    expected = model(x)
    assert (expected - without_seed(model, engine.slots["net.1"], x)).abs().max() > 1e-3
    shipped = export(model, x)
    assert torch.equal(shipped(x), expected)
    _assert_plain_torch(shipped)
    names = {n for n, _ in shipped.named_parameters()}
    assert any(n.startswith("esper_slots.net__1.seed.") for n in names)
    assert not any(n.startswith("esper_slots.net__4") for n in names)
    # The model itself keeps its slots and hooks.
    assert isinstance(model.esper_slots["net__1"], SeedSlot)
    assert torch.equal(model(x), expected)
    assert not torch.equal(without_seed(model, engine.slots["net.1"], x), expected)


@pytest.mark.parametrize("stage", IDENTITY_STAGES, ids=lambda s: s.name)
def test_identity_slots_are_removed(stage):
    torch.manual_seed(0)
    model = TinyHost()
    grow(model.slot, stage)
    x = torch.randn(2, 3, 8, 8)
    shipped = export(model, x)
    assert torch.equal(shipped(x), model(x))
    assert {n for n, _ in shipped.named_parameters()} == {
        "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"
    }


@pytest.mark.parametrize("stage", LIVE_STAGES, ids=lambda s: s.name)
def test_live_seed_is_refused_or_dropped(stage):
    host = cifar_host(stage)
    x = torch.randn(2, 3, 16, 16)
    with pytest.raises(ValueError, match=rf"slot 'r0c1' holds a live seed \({stage.name}\); "
                                         "fossilize or prune it before export"):
        export(host, x)
    shipped = export(host, x, live="drop")
    assert torch.equal(shipped(x), without_seed(host, host.slots["r0c1"], x))
    if stage != SeedStage.TRAINING:  # a blended seed changes the output: dropping it shows
        assert not torch.allclose(shipped(x), host(x))


def test_fossil_blend_formulas():
    torch.manual_seed(0)
    seed, gate = nn.Conv2d(4, 4, 1), nn.Sequential(nn.Flatten(), nn.Linear(36, 1),
                                                     nn.Sigmoid(), nn.Unflatten(1, (1, 1, 1)))
    h = torch.randn(2, 4, 3, 3)
    s = seed(h)
    cases = {
        AlphaAlgorithm.ADD: h + 0.5 * (s - h),
        AlphaAlgorithm.MULTIPLY: h * (1 + 0.5 * torch.tanh(s - h)),
        AlphaAlgorithm.GATE: h + (0.5 * gate(h)).clamp(0, 1) * (s - h),
    }
    for algorithm, expected in cases.items():
        torch.testing.assert_close(FossilBlend(seed, gate, algorithm, 0.5)(h), expected,
                                   rtol=0, atol=1e-6)
    assert torch.equal(FossilBlend(seed, None, AlphaAlgorithm.ADD, 1.0)(h), s)
    with pytest.raises(ValueError, match="GATE blend needs the slot's gate module"):
        FossilBlend(seed, None, AlphaAlgorithm.GATE, 1.0)


def test_bad_arguments_and_fixed_shapes():
    model = TinyHost()
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(ValueError, match="unknown live policy 'keep'; accepted: error, drop"):
        export(model, x, live="keep")
    with pytest.raises(ValueError, match=r"shape \(1, 3, 8, 8\): a dynamic batch needs at least"):
        export(model, x)
    with pytest.raises(ValueError, match="unknown dynamic_shapes 'batches'; accepted: 'batch'"):
        export(model, x, dynamic_shapes="batches")
    shipped = export(model, x, dynamic_shapes=None)
    assert torch.equal(shipped(x), model(x))
    with pytest.raises(AssertionError):  # the batch size was fixed at export
        shipped(torch.randn(2, 3, 8, 8))
