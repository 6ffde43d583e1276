"""The arm grammar of depth growth (`app.compare.stack_arms`): ``stack:K@TAU[:OPERATOR]`` and
``born:K``, parsed and checked against the host, each refusal one line."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import esper_lightning.app.compare.stack_arms as stack_arms
from esper_lightning.app.compare.arms import parse_controller
from esper_lightning.app.compare.stack_arms import born_implants, parse_stack, stack_controller
from esper_lightning.errors import ConfigError
from esper_lightning.hosts.presets import GPT_PRESETS

CHAIN = ("r1c0", "r1c1", "r1c2")  # grow4x1's growth slots, one block each


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("4@0.5", (4, (0.5,), "copy")), ("4@0.25:identity", (4, (0.25,), "identity")),
     ("3@.8:random", (3, (0.8,), "random")), ("2@random:identity", (2, None, "identity")),
     ("4@0.2,0.5:copy", (4, (0.2, 0.5), "copy"))],
)
def test_parse_stack(text, parsed):
    assert parse_stack(text) == parsed
    assert parse_controller(f"stack:{text}").kind == "stack"


def test_random_timing_draws_tau_from_the_episode_and_only_from_it():
    grow2 = GPT_PRESETS["grow2"]
    taus = [stack_controller("2@random:identity", grow2, ("r1c0",), "transformer",
                             rng_seed=k).tau for k in range(400)]
    again = [stack_controller("2@random:identity", grow2, ("r1c0",), "transformer",
                              rng_seed=k).tau for k in range(400)]
    assert taus == again  # episode k grows at the same time in every comparison
    assert all(0.0 <= t < 1.0 for t in taus) and len(set(taus)) == 400
    # uniform on [0, 1): each quarter gets about 100 of the 400 (binomial sd 8.7)
    counts = np.histogram(taus, bins=4, range=(0.0, 1.0))[0]
    assert all(60 <= c <= 140 for c in counts), counts
    with pytest.raises(ValueError, match="draws its tau from the episode's rng_seed"):
        stack_controller("2@random", grow2, ("r1c0",), "transformer")
    # Two growth slots (1 -> 2 -> 4): each growth at its own random time, in order.
    grow124 = GPT_PRESETS["grow124"]
    pairs = [stack_controller("4@random:identity", grow124, ("r1c0", "r1c1"), "transformer",
                              rng_seed=k).taus for k in range(400)]
    assert all(len(p) == 2 and 0.0 <= p[0] <= p[1] < 1.0 for p in pairs)
    assert len({p[1] - p[0] for p in pairs}) == 400  # not one time for both
    # the earlier of two uniforms: P(< 0.5) = 3/4, about 300 of 400 (binomial sd 8.7)
    assert 260 <= sum(p[0] < 0.5 for p in pairs) <= 340


@pytest.mark.parametrize("text", ["4", "4@", "@0.5", "4@0.5:", "4@1..2", "x@0.5:copy",
                                  "4@randomly", "4@0.5:zero"])
def test_bad_stack_spec_is_one_line(text):
    with pytest.raises(ConfigError, match=r"accepted: stack:K@TAU\[:OPERATOR\]|is not a number"):
        parse_stack(text)


def test_stack_and_born_specs_are_checked_against_the_host():
    grow4, grow4x1 = GPT_PRESETS["grow4"], GPT_PRESETS["grow4x1"]
    one = stack_controller("4@0.5:identity", grow4, ("r0c0", "r1c0"), "transformer")
    assert (one.slots, one.operator, one.taus) == (("r1c0",), "identity", (0.5,))
    assert stack_controller("4@0.5", grow4x1, CHAIN, "transformer").slots == CHAIN
    with pytest.raises(ConfigError, match=r"^stack:3@0.5: K=3 is not the host's grown depth; "
                                          r"accepted: stack:4 \(1 block\(s\) \+ growth "
                                          r"slot\(s\) of 3 block\(s\)\)$"):
        stack_controller("3@0.5", grow4, ("r1c0",), "transformer")
    with pytest.raises(ConfigError, match=r"grows in the growth slots r1c0 r1c1 r1c2; the run "
                                          r"lacks r1c2 \(--slots r1c0 r1c1\)"):
        stack_controller("4@0.5", grow4x1, CHAIN[:2], "transformer")
    # A CNN has no growth slots: that is the problem named (not its blueprints, which it
    # listed as the arms "accepted").
    with pytest.raises(ConfigError, match=r"^stack:4@0.5 needs a host with growth slots"):
        stack_controller("4@0.5", None, ("r0c0", "r0c1", "r0c2"), "cnn")
    with pytest.raises(ConfigError, match="needs a host with growth slots"):
        stack_controller("2@0.5", GPT_PRESETS["tiny"], ("r0c0", "r0c1"), "transformer")
    assert born_implants("4", grow4, ("r1c0",)) == (("r1c0", "block_random"),)
    assert born_implants("4", grow4x1, CHAIN) == tuple((s, "block_random") for s in CHAIN)
    assert born_implants("2", GPT_PRESETS["grow2"], ("r0c0", "r1c0")) == (
        ("r1c0", "block_random"),)
    with pytest.raises(ConfigError, match="accepted: born:K"):
        born_implants("four", grow4, ("r1c0",))
    with pytest.raises(ConfigError, match="born:3: K=3 is not the host's grown depth; "
                                          "accepted: born:4"):
        born_implants("3", grow4x1, CHAIN)


def test_docstring_examples_run():
    result = doctest.testmod(stack_arms)
    assert result.attempted > 0 and result.failed == 0
