"""Tests for the blueprint registry and the built-in CNN, transformer and linear seeds."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from esper_lightning import blueprints
from esper_lightning.blueprints import (
    TOPOLOGIES,
    BlueprintError,
    BlueprintSpec,
    available,
    blueprint_table,
    build,
    get_spec,
    param_count,
    register,
    scratch_registry,
    unregister,
)
from esper_lightning.blueprints.block import Block
from esper_lightning.blueprints.cnn import PreActResidual, num_groups
from esper_lightning.blueprints.growth import GrowthSite
from esper_lightning.blueprints.registry import LayerScale, LayerScale2d
from esper_lightning.blueprints.transformer import default_num_heads

CNN_NAMES = {
    "norm",
    "attention",
    "depthwise",
    "bottleneck",
    "conv_small",
    "conv_light",
    "conv_heavy",
}
TRANSFORMER_NAMES = {"norm", "lora", "lora_large", "attention", "mlp_small", "mlp"}
#: Block seeds: a whole transformer block built on the one their slot follows
#: (tests/test_blueprints_block.py); not LayerScale seeds, so not in the seed-property cases.
BLOCK_NAMES = {"block_copy", "block_identity", "block_random"}
LINEAR_NAMES = {"norm", "mlp_bottleneck", "mlp_small", "mlp"}

CNN_WIDTHS = (6, 8, 16, 32)  # 6: not divisible by 4, GroupNorm falls back to 2 groups
TRANSFORMER_WIDTHS = (32, 48)
LINEAR_WIDTHS = (5, 32, 48)  # 5: narrower than the bottleneck's minimum of 8


def _bottleneck_count(c: int) -> int:
    b = max(8, c // 4)
    return 2 * c * b + 9 * b * b + 4 * b + 2 * c


# The formulas documented in the blueprint docstrings: a second source of truth for param_count.
FORMULAS: dict[tuple[str, str], Callable[[int], int]] = {
    ("cnn", "norm"): lambda c: 2 * c + 1,
    ("cnn", "attention"): lambda c: 2 * c * max(1, c // 4) + 2 * c,
    ("cnn", "depthwise"): lambda c: c * c + 13 * c,
    ("cnn", "bottleneck"): _bottleneck_count,
    ("cnn", "conv_small"): lambda c: c * c + 4 * c,
    ("cnn", "conv_light"): lambda c: 9 * c * c + 4 * c,
    ("cnn", "conv_heavy"): lambda c: 18 * c * c + 6 * c,
    ("transformer", "norm"): lambda d: 2 * d + 1,
    ("transformer", "lora"): lambda d: 2 * d * 8 + d,
    ("transformer", "lora_large"): lambda d: 2 * d * 32 + d,
    ("transformer", "attention"): lambda d: 4 * d * d + 7 * d,
    ("transformer", "mlp_small"): lambda d: 4 * d * d + 6 * d,
    ("transformer", "mlp"): lambda d: 8 * d * d + 8 * d,
    **{("transformer", name): (lambda d: 12 * d * d + 13 * d) for name in BLOCK_NAMES},
    ("linear", "norm"): lambda d: 2 * d + 1,
    ("linear", "mlp_bottleneck"): lambda d: 2 * d * max(8, d // 4) + max(8, d // 4) + 4 * d,
    ("linear", "mlp_small"): lambda d: 4 * d * d + 6 * d,
    ("linear", "mlp"): lambda d: 8 * d * d + 8 * d,
}


def _cases(widths: dict[str, tuple[int, ...]], blocks: bool = False) -> list[pytest.param]:
    """Every blueprint at every width; block seeds only with ``blocks``."""
    return [
        pytest.param(topology, name, width, id=f"{topology}-{name}-{width}")
        for topology in TOPOLOGIES
        for name in available(topology)
        for width in widths[topology]
        if blocks or not get_spec(name, topology).context
    ]


def _build(name: str, width: int, topology: str) -> nn.Module:
    """`build`, giving a growth seed a growth site with one host block before it."""
    context = None
    if get_spec(name, topology).context:
        block = Block.like(Block(width, default_num_heads(width)))
        context = {"growth": GrowthSite(1, lambda: [block], width=width)}
    return build(name, width, topology, context=context)


LIVE_CASES = _cases({"cnn": CNN_WIDTHS, "transformer": TRANSFORMER_WIDTHS,
                     "linear": LINEAR_WIDTHS})
_SHAPES = {"cnn": lambda b, w: (b, w, 8, 8), "transformer": lambda b, w: (b, 8, w),
           "linear": lambda b, w: (b, w)}


def _random_input(topology: str, width: int, batch: int = 4) -> torch.Tensor:
    return torch.randn(_SHAPES[topology](batch, width))


def _set_layer_scale(module: nn.Module, value: float) -> int:
    scales = [m for m in module.modules() if isinstance(m, (LayerScale, LayerScale2d))]
    with torch.no_grad():
        for scale in scales:
            scale.gamma.fill_(value)
    return len(scales)


@pytest.mark.parametrize(("topology", "name", "width"), LIVE_CASES)
def test_every_parameter_gets_gradient_at_birth(topology: str, name: str, width: int) -> None:
    torch.manual_seed(0)
    seed = build(name, width, topology)
    x = _random_input(topology, width)
    out = seed(x)
    (out * torch.randn_like(out)).sum().backward()  # a random projection of the output
    params = dict(seed.named_parameters())
    assert params, "a blueprint without parameters can never learn"
    dead = [n for n, p in params.items() if p.grad is None or not bool(p.grad.abs().max() > 0)]
    assert not dead, f"{topology}:{name} at width {width} has dead parameters {dead}"


@pytest.mark.parametrize(("topology", "name", "width"), LIVE_CASES)
def test_seed_is_near_identity_at_birth(topology: str, name: str, width: int) -> None:
    torch.manual_seed(1)
    seed = build(name, width, topology)
    x = _random_input(topology, width)
    for train in (True, False):
        seed.train(train)
        with torch.no_grad():
            deviation = ((seed(x) - x).norm() / x.norm()).item()
        assert deviation <= 1e-2, f"{topology}:{name} deviates {deviation:.3g} from identity"


@pytest.mark.parametrize(("topology", "name", "width"), LIVE_CASES)
def test_residual_update_is_signed(topology: str, name: str, width: int) -> None:
    # A final ReLU on the branch would make every update non-negative (upstream's conv seeds).
    torch.manual_seed(5)
    seed = build(name, width, topology)
    x = _random_input(topology, width)
    with torch.no_grad():
        update = seed(x) - x
    assert bool((update > 0).any()) and bool((update < 0).any())


@pytest.mark.parametrize("name", sorted(CNN_NAMES))
@pytest.mark.parametrize(("height", "width"), [(32, 32), (7, 5), (1, 1)])
def test_cnn_seed_preserves_shape(name: str, height: int, width: int) -> None:
    seed = build(name, 6)
    x = torch.randn(2, 6, height, width)
    out = seed(x)
    assert out.shape == x.shape
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(TRANSFORMER_NAMES))
@pytest.mark.parametrize("tokens", [1, 5])
def test_transformer_seed_preserves_shape(name: str, tokens: int) -> None:
    seed = build(name, 12, "transformer")
    x = torch.randn(3, tokens, 12)
    out = seed(x)
    assert out.shape == x.shape
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(LINEAR_NAMES))
@pytest.mark.parametrize("shape", [(3, 12), (3, 5, 12), (1, 12)])
def test_linear_seed_preserves_shape_and_acts_row_by_row(name: str, shape: tuple) -> None:
    torch.manual_seed(6)
    seed = build(name, 12, "linear")
    _set_layer_scale(seed, 1.0)  # make the branch visible
    x = torch.randn(shape)
    with torch.no_grad():
        out = seed(x)
        assert out.shape == x.shape and torch.isfinite(out).all()
        perturbed = x.clone()
        perturbed[0] += 1.0 + torch.randn(shape[1:])  # one row (sample) changes
        moved = (seed(perturbed) - out).flatten(1).abs().amax(dim=1)
    assert moved[0] > 0 and bool((moved[1:] == 0).all()), "a linear seed mixed rows"


def test_shared_names_build_the_same_module_in_linear_and_transformer_slots() -> None:
    for name in ("norm", "mlp_small", "mlp"):
        torch.manual_seed(7)
        linear = build(name, 16, "linear")
        torch.manual_seed(7)
        transformer = build(name, 16, "transformer")
        x = torch.randn(2, 3, 16)
        assert torch.equal(linear(x), transformer(x)), name


def test_linear_blueprints_have_table_indices_after_the_historical_ones() -> None:
    from esper_lightning.blueprints import blueprint_index

    assert blueprint_index("mlp_bottleneck") == 13  # appended: every older index keeps its name
    assert blueprint_index("mlp") == 11 and blueprint_index("norm") == 3


@settings(max_examples=15, deadline=None)
@given(
    channels=st.integers(1, 40),
    height=st.integers(1, 12),
    width=st.integers(1, 12),
    name=st.sampled_from(sorted(CNN_NAMES)),
)
def test_cnn_seed_works_for_any_width_and_size(
    channels: int, height: int, width: int, name: str
) -> None:
    seed = build(name, channels)
    x = torch.randn(2, channels, height, width)
    assert seed(x).shape == x.shape


@pytest.mark.parametrize(
    ("topology", "name", "width"),
    _cases({"cnn": (1, 6, 8, 64, 100), "transformer": (6, 32, 384), "linear": (1, 6, 64, 128)},
           blocks=True),
)
def test_param_count_matches_built_module_and_formula(topology: str, name: str, width: int) -> None:
    seed = _build(name, width, topology)
    actual = sum(p.numel() for p in seed.parameters() if p.requires_grad)
    assert param_count(name, width, topology) == actual
    assert actual == FORMULAS[topology, name](width)


@pytest.mark.parametrize(
    ("name", "kernel_size", "depth"),
    [("conv_small", 1, 1), ("conv_light", 3, 1), ("conv_heavy", 3, 2)],
)
def test_the_conv_seeds_are_one_class_with_per_blueprint_arguments(name, kernel_size, depth):
    seed = build(name, 8)
    assert type(seed) is PreActResidual and len(seed.units) == depth
    assert {u[-1].kernel_size for u in seed.units} == {(kernel_size, kernel_size)}
    # The parameter names grown models saved before the classes were folded.
    assert ("units.0.0.weight" in dict(seed.named_parameters())
            and "ls.gamma" in dict(seed.named_parameters()))


def test_scratch_registry_puts_specs_and_table_back() -> None:
    table, norm = blueprint_table(), get_spec("norm")
    with scratch_registry():
        unregister("norm")
        register(BlueprintSpec("scratch", "transformer", lambda d: nn.Identity(), "identity"))
        assert blueprint_table() == (*table, "scratch")
    assert blueprint_table() == table and get_spec("norm") is norm
    with pytest.raises(BlueprintError):
        get_spec("scratch", "transformer")


def test_counting_and_listing_do_not_touch_the_global_rng() -> None:
    # Parameters are counted on the meta device: no allocation and no draws from the RNG, so
    # listing blueprints (e.g. for action masks) cannot change a training run.
    state = torch.get_rng_state()
    for topology in TOPOLOGIES:
        available(topology)
    assert param_count("conv_heavy", 512) == 18 * 512 * 512 + 6 * 512
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("name", sorted(TRANSFORMER_NAMES))
def test_transformer_seed_is_causal(name: str) -> None:
    torch.manual_seed(2)
    dim, tokens = 16, 6
    seed = build(name, dim, "transformer").train()
    # At gamma = 1e-3 a leak would hide under float noise; make the branch fully visible.
    assert _set_layer_scale(seed, 1.0) > 0 or name == "norm"
    x = torch.randn(2, tokens, dim)
    with torch.no_grad():
        base = seed(x)
        for t in range(tokens):
            perturbed = x.clone()
            perturbed[:, t] += torch.randn(2, dim)
            out = seed(perturbed)
            assert torch.equal(out[:, :t], base[:, :t]), f"position < {t} saw token {t}"
            assert not torch.allclose(out[:, t], base[:, t])


def test_transformer_attention_mixes_past_tokens() -> None:
    # The causality test above would also pass for a per-token branch; check the branch attends.
    torch.manual_seed(3)
    seed = build("attention", 16, "transformer")
    _set_layer_scale(seed, 1.0)
    x = torch.randn(1, 5, 16)
    perturbed = x.clone()
    perturbed[:, 0] += torch.randn(16)  # not a constant shift: the pre-norm would remove it
    with torch.no_grad():
        delta = (seed(perturbed) - seed(x))[0, 1:].abs().amax(dim=-1)
    assert bool((delta > 1e-4).all())


def test_available_lists_builtins_sorted_by_size() -> None:
    for topology, expected, width in (
        ("cnn", CNN_NAMES, 64),
        ("transformer", TRANSFORMER_NAMES | BLOCK_NAMES, 384),
        ("linear", LINEAR_NAMES, 128),
    ):
        names = available(topology)
        assert isinstance(names, tuple)
        assert set(names) == expected and len(names) == len(expected)
        keys = [(param_count(n, width, topology), n) for n in names]
        assert keys == sorted(keys)
    assert available() == available("cnn")
    assert available("cnn")[0] == "norm" and available("cnn")[-1] == "conv_heavy"


def test_available_builds_each_spec_once_and_a_name_registered_again_anew() -> None:
    """`available` sorts by each seed's size, counted once per registered spec: a name
    registered again with another factory takes its new size's place."""
    builds: list[int] = []

    def linear(width: int) -> Callable[[int], nn.Module]:
        def factory(channels: int) -> nn.Module:
            builds.append(width)
            return nn.Linear(channels, width)
        return factory

    with scratch_registry():
        register(BlueprintSpec("tmp", "linear", linear(1), "one output"))
        assert available("linear")[0] == "tmp"  # 128 * 1 + 1 parameters: the smallest
        available("linear")
        assert builds == [1]
        unregister("tmp", "linear")
        register(BlueprintSpec("tmp", "linear", linear(10_000), "many outputs"))
        assert available("linear")[-1] == "tmp"
        assert builds == [1, 10_000]


def test_no_batchnorm_and_no_running_statistics() -> None:
    for topology in TOPOLOGIES:
        for name in available(topology):
            seed = _build(name, 8, topology)
            assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in seed.modules())
            assert not list(seed.buffers()), f"{topology}:{name} carries running statistics"


@pytest.mark.parametrize(
    ("channels", "groups"),
    [(1, 1), (6, 2), (7, 1), (8, 8), (24, 1), (32, 2), (64, 4), (96, 4), (256, 16), (512, 32)],
)
def test_num_groups_examples(channels: int, groups: int) -> None:
    assert num_groups(channels) == groups


@given(st.integers(1, 4096))
def test_num_groups_rule(channels: int) -> None:
    groups = num_groups(channels)
    divisors = [g for g in (32, 16, 8, 4, 2, 1) if channels % g == 0]
    wide = [g for g in divisors if channels // g >= 16]
    assert groups == (wide[0] if wide else divisors[0])


def test_build_places_parameters_and_restores_mode() -> None:
    seed = build("conv_light", 8, dtype=torch.float64, device="cpu")
    assert seed.training
    assert {p.dtype for p in seed.parameters()} == {torch.float64}
    assert {p.device.type for p in seed.parameters()} == {"cpu"}
    x = torch.randn(1, 8, 4, 4, dtype=torch.float64)
    assert seed(x).dtype == torch.float64


def test_get_spec_returns_registered_spec() -> None:
    spec = get_spec("lora", "transformer")
    assert isinstance(spec, BlueprintSpec)
    assert (spec.name, spec.topology) == ("lora", "transformer")
    assert spec.description
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]


def test_unknown_blueprint_names_the_value_and_the_alternatives() -> None:
    with pytest.raises(BlueprintError, match=r"unknown blueprint 'foo' for topology 'cnn'") as info:
        build("foo", 8)
    assert "available: " + ", ".join(available("cnn")) in str(info.value)
    with pytest.raises(BlueprintError, match="'lora'"):
        param_count("lora", 8, "cnn")
    with pytest.raises(BlueprintError, match="'foo'"):
        get_spec("foo", "transformer")


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(available, id="available"),
        pytest.param(lambda t: build("norm", 8, t), id="build"),
        pytest.param(lambda t: get_spec("norm", t), id="get_spec"),
        pytest.param(lambda t: param_count("norm", 8, t), id="param_count"),
    ],
)
def test_unknown_topology_names_the_value(call: Callable[[str], object]) -> None:
    with pytest.raises(BlueprintError,
                       match=r"unknown topology 'rnn'; accepted: cnn, transformer, linear"):
        call("rnn")


@pytest.mark.parametrize("channels", [0, -3, 2.5, True])
def test_bad_channels_are_rejected(channels: object) -> None:
    with pytest.raises(BlueprintError, match=repr(channels).replace(".", r"\.")):
        build("norm", channels)  # type: ignore[arg-type]
    with pytest.raises(BlueprintError):
        param_count("norm", channels)  # type: ignore[arg-type]


def test_blueprint_error_is_a_value_error() -> None:
    assert issubclass(BlueprintError, ValueError)


@pytest.fixture
def temporary_spec() -> Iterator[Callable[[BlueprintSpec], BlueprintSpec]]:
    added: list[BlueprintSpec] = []

    def add(spec: BlueprintSpec) -> BlueprintSpec:
        added.append(register(spec))
        return spec

    with scratch_registry():  # the names leave the blueprint table too
        yield add
        for spec in added:
            unregister(spec.name, spec.topology)


def test_shape_changing_blueprint_is_rejected(temporary_spec) -> None:
    temporary_spec(
        BlueprintSpec("halve", "cnn", lambda c: nn.Conv2d(c, c // 2, 1), "drops channels")
    )
    assert "halve" in available("cnn")
    with pytest.raises(
        BlueprintError,
        match=r"blueprint 'halve' changed the shape \(2, 8, 8, 8\) -> \(2, 4, 8, 8\); "
        r"seeds must preserve their input shape",
    ):
        build("halve", 8)


def test_non_tensor_and_non_module_blueprints_are_rejected(temporary_spec) -> None:
    class TupleOut(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    temporary_spec(BlueprintSpec("pair", "transformer", lambda d: TupleOut(), "returns a tuple"))

    def not_a_module(width: int) -> nn.Module:
        return width  # type: ignore[return-value]

    temporary_spec(BlueprintSpec("plain", "transformer", not_a_module, "no module"))
    with pytest.raises(BlueprintError, match="'pair' returned tuple"):
        build("pair", 8, "transformer")
    with pytest.raises(BlueprintError, match="'plain' factory returned int"):
        build("plain", 8, "transformer")


def test_crashing_blueprint_is_rejected_with_its_error(temporary_spec) -> None:
    temporary_spec(BlueprintSpec("wrong_in", "cnn", lambda c: nn.Conv2d(c + 1, c, 1), "bad"))
    with pytest.raises(BlueprintError, match="'wrong_in' failed the shape probe"):
        build("wrong_in", 4)


def test_register_rejects_duplicates_and_unknown_topologies(temporary_spec) -> None:
    with pytest.raises(BlueprintError, match="'norm' is already registered for topology 'cnn'"):
        register(BlueprintSpec("norm", "cnn", nn.Identity, "duplicate"))
    with pytest.raises(BlueprintError, match="unknown topology 'rnn'"):
        register(BlueprintSpec("identity", "rnn", nn.Identity, "bad topology"))
    # The same name is fine under another topology once it is free there.
    temporary_spec(BlueprintSpec("identity", "cnn", lambda c: nn.Identity(), "identity"))
    assert build("identity", 3) is not None
    with pytest.raises(BlueprintError, match="'identity'"):
        get_spec("identity", "transformer")


def test_unregister_removes_and_returns_the_spec() -> None:
    with scratch_registry():
        spec = register(BlueprintSpec("tmp", "cnn", lambda c: nn.Identity(), "temporary"))
        try:
            assert "tmp" in available("cnn")
        finally:
            assert unregister("tmp", "cnn") is spec
        assert "tmp" not in available("cnn")
        with pytest.raises(BlueprintError, match="'tmp'"):
            unregister("tmp", "cnn")
    assert "tmp" not in blueprint_table()


@pytest.mark.parametrize("name", sorted(CNN_NAMES))
def test_cnn_seed_trains_on_a_regression_target(name: str) -> None:
    torch.manual_seed(4)
    seed = build(name, 8)
    # Off-centre, unnormalised input, like a host activation (and so the norm seed has work to do).
    x = 2.0 * torch.randn(8, 8, 8, 8) + 0.5
    target = 1.2 * x  # reachable by every blueprint through its residual gain
    optimizer = torch.optim.SGD(seed.parameters(), lr=2.0, momentum=0.9)

    def loss() -> torch.Tensor:
        return (seed(x) - target).square().mean()

    initial = loss().item()
    for _ in range(20):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    final = loss().item()
    # Over several RNG seeds the worst ratio is about 0.76 (depthwise); a dead seed stays at 1.
    assert final < 0.9 * initial, f"{name}: loss {initial:.4g} -> {final:.4g}"


def test_package_exports_contract() -> None:
    assert TOPOLOGIES == ("cnn", "transformer", "linear")
    for symbol in (
        "available",
        "build",
        "param_count",
        "get_spec",
        "BlueprintSpec",
        "BlueprintError",
        "TOPOLOGIES",
        "register",
    ):
        assert symbol in blueprints.__all__
