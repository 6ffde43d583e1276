"""`SeedingConfig`: its defaults (the engine's, the callback's and the envs' of before), its
one-line refusals, its round trip through plain data, the callback's keyword shorthand and the
durations an engine can apply without a run plan."""

from __future__ import annotations

import json

import pytest

from esper_lightning.core.lifecycle import GateConfig, GateMode
from esper_lightning.core.optim import SeedOptimConfig
from esper_lightning.core.seeding import (
    GRAD_STATS_EVERY,
    SHORTHAND,
    SeedingConfig,
    with_shorthand,
)
from esper_lightning.core.timing import Duration, SeedTiming

#: Every option away from its default.
FULL = SeedingConfig(
    blueprints=("norm", "conv_light"), max_seeds=2, gate_mode="strict",
    gate_config=GateConfig(min_training_epochs=3, min_fossilize_contribution=0.25),
    blend_gradient="detached", layer_scale_init=0.5,
    seed_optim=SeedOptimConfig(lr=0.01, momentum=0.9, weight_decay=0.0),
    grad_stats_every=7,
    timing=SeedTiming(incubation="10%", blend="200 steps", hold=3, embargo="0.5 epochs"),
)


def test_the_defaults_are_what_the_engine_and_the_callback_took_before():
    seeding = SeedingConfig()
    assert (seeding.blueprints, seeding.max_seeds, seeding.gate_mode, seeding.gate_config,
            seeding.blend_gradient, seeding.layer_scale_init, seeding.timing) == (None,) * 7
    assert seeding.seed_optim == SeedOptimConfig() and seeding.seed_optim.overrides() == {}
    assert seeding.grad_stats_every == GRAD_STATS_EVERY == 25
    assert seeding.fixed_durations() == {}


def test_values_are_normalised_once():
    seeding = SeedingConfig(blueprints=["norm"], gate_mode="strict", layer_scale_init=1)
    assert seeding.blueprints == ("norm",)
    assert seeding.gate_mode is GateMode.STRICT
    assert isinstance(seeding.layer_scale_init, float) and seeding.layer_scale_init == 1.0
    assert seeding.timing is None and FULL.timing.incubation == Duration(0.1, "run")


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"max_seeds": 0}, ValueError, "max_seeds must be an int >= 1 or None, got 0"),
    ({"max_seeds": True}, ValueError, "max_seeds must be an int >= 1 or None, got True"),
    ({"grad_stats_every": 0}, ValueError, "grad_stats_every must be an int >= 1, got 0"),
    ({"grad_stats_every": None}, ValueError, "grad_stats_every must be an int >= 1, got None"),
    ({"gate_mode": "strictt"}, ValueError,
     "unknown gate mode 'strictt'; accepted: permissive, strict"),
    ({"blend_gradient": "sideways"}, ValueError,
     "unknown blend_gradient 'sideways'; accepted: "),
    ({"layer_scale_init": -1.0}, ValueError,
     "layer_scale_init must be a number >= 0 or None, got -1.0"),
    ({"blueprints": "norm"}, ValueError,
     "blueprints must be a list of names, got the string 'norm'"),
    ({"blueprints": []}, ValueError, "blueprints must be a non-empty list of blueprint names"),
    ({"blueprints": ["norm", "norm"]}, ValueError,
     "blueprints lists a blueprint twice: norm, norm"),
    ({"gate_config": {"min_training_epochs": 1}}, TypeError,
     "gate_config must be a GateConfig or None, got dict"),
    ({"seed_optim": None}, TypeError, "seed_optim must be a SeedOptimConfig, got NoneType"),
    ({"timing": "10%"}, TypeError, "timing must be a SeedTiming or None, got str"),
])
def test_a_bad_option_is_refused_in_one_line(options, error, message):
    with pytest.raises(error) as err:
        SeedingConfig(**options)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_every_option_survives_plain_data_and_json():
    data = json.loads(json.dumps(FULL.to_dict()))
    assert data["gate_mode"] == "strict" and data["blueprints"] == ["norm", "conv_light"]
    assert data["timing"] == {"incubation": "0.1 run", "blend": "200.0 steps",
                              "hold": "3 decisions", "embargo": "0.5 epochs"}
    assert SeedingConfig.from_dict(data) == FULL
    assert SeedingConfig.from_dict(SeedingConfig().to_dict()) == SeedingConfig()
    assert SeedingConfig.from_dict({"max_seeds": 3}) == SeedingConfig(max_seeds=3)
    odd = SeedingConfig(timing=SeedTiming(incubation=Duration(0.123456789, "run")))
    assert SeedingConfig.from_dict(odd.to_dict()) == odd  # every digit of a duration kept


def test_from_dict_refuses_an_unknown_key_and_a_bad_value():
    with pytest.raises(ValueError, match=r"unknown seeding option\(s\) 'seed_lr'; accepted: "
                                         "blueprints, max_seeds, gate_mode"):
        SeedingConfig.from_dict({"seed_lr": 0.1})
    with pytest.raises(ValueError, match="max_seeds must be an int >= 1 or None, got -2"):
        SeedingConfig.from_dict({"max_seeds": -2})


def test_the_shorthand_fills_in_the_fields_of_its_names():
    seeding = with_shorthand(None, "owner", blend_gradient="detached", seed_lr=0.5,
                             seed_weight_decay=0.0, grad_stats_every=5, max_seeds=None)
    assert seeding == SeedingConfig(blend_gradient="detached", grad_stats_every=5,
                                    seed_optim=SeedOptimConfig(lr=0.5, weight_decay=0.0))
    assert with_shorthand(FULL, "owner") is FULL  # nothing given: the config as it is
    # A keyword fills what the config leaves at its default, and may repeat what it sets.
    base = SeedingConfig(max_seeds=2, seed_optim=SeedOptimConfig(lr=0.1))
    merged = with_shorthand(base, "owner", max_seeds=2, seed_momentum=0.9, gate_mode="strict")
    assert merged == SeedingConfig(max_seeds=2, gate_mode="strict",
                                   seed_optim=SeedOptimConfig(lr=0.1, momentum=0.9))
    assert set(SHORTHAND) == {"blueprints", "max_seeds", "gate_mode", "gate_config",
                              "blend_gradient", "layer_scale_init", "seed_lr", "seed_momentum",
                              "seed_weight_decay", "grad_stats_every", "timing"}


@pytest.mark.parametrize(("keyword", "value", "message"), [
    ("blend_gradient", "through", "owner: blend_gradient='through' contradicts "
     "seeding.blend_gradient='detached'; accepted: one of them, or equal values"),
    ("seed_lr", 0.02, "owner: seed_lr=0.02 contradicts seeding.seed_optim.lr=0.01;"),
    ("gate_mode", "permissive", "owner: gate_mode='permissive' contradicts "
     "seeding.gate_mode='strict';"),
    ("blueprints", ["norm"], "owner: blueprints=['norm'] contradicts "
     "seeding.blueprints=('norm', 'conv_light');"),
])
def test_a_keyword_that_contradicts_the_config_is_refused(keyword, value, message):
    with pytest.raises(ValueError) as err:
        with_shorthand(FULL, "owner", **{keyword: value})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    # The same value twice is no contradiction (a list and a tuple of the same names too).
    assert with_shorthand(FULL, "owner", blueprints=["norm", "conv_light"]) == FULL


def test_the_shorthand_refuses_what_it_does_not_know_and_what_the_config_refuses():
    with pytest.raises(TypeError, match=r"owner: unknown seeding keyword\(s\) seed_beta; accepted: "
                                        "blueprints, max_seeds"):
        with_shorthand(None, "owner", seed_beta=0.9)
    with pytest.raises(ValueError, match="seed lr must be a finite number >= 0 or None, got -1"):
        with_shorthand(None, "owner", seed_lr=-1)


def test_an_engine_applies_durations_in_decisions_only():
    timing = SeedTiming(incubation=3, blend=Duration(2.5), embargo=0)
    assert SeedingConfig(timing=timing).fixed_durations() == {
        "incubation": 3, "blend": 3, "embargo": 0}
    with pytest.raises(ValueError) as err:
        FULL.fixed_durations()
    assert str(err.value) == ("timing.incubation='10% of the run' needs the run's plan, which "
                              "only the Trainer callback has; accepted here: durations in "
                              "decisions (an int)")
