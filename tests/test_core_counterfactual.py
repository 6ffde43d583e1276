import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from esper_lightning.core.alpha import AlphaAlgorithm
from esper_lightning.core.counterfactual import (
    ALL_OFF,
    DEFAULT_MODES,
    MAIN,
    MODES,
    CounterfactualAccumulator,
    LogitsError,
    default_mode,
    fused_forward,
    make_plan,
    probe_plan,
    separate_forward,
)
from esper_lightning.core.lifecycle import SeedStage
from esper_lightning.hosts import CifarCNNHost, GPTHost


def _blend(host: CifarCNNHost, slot_id: str, blueprint: str, ticks: int) -> None:
    slot = host.slots[slot_id]
    slot.germinate(blueprint, tempo=5)
    slot.advance()
    slot.state.metrics.epochs_in_stage = 10
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    assert slot.advance().passed
    for _ in range(ticks):
        slot.tick()


def _grown_host() -> CifarCNNHost:
    torch.manual_seed(0)
    host = CifarCNNHost("baseline", slots=["r0c0", "r0c1", "r1c2"])
    _blend(host, "r0c0", "conv_light", ticks=5)  # alpha 1 -> HOLDING after advance
    host.slots["r0c0"].advance()
    _blend(host, "r0c1", "conv_heavy", ticks=2)  # mid-ramp
    host.slots["r1c2"].germinate("norm")  # not blending: not measured
    # Make the seeds matter so contributions are not trivially zero.
    with torch.no_grad():
        for slot_id in ("r0c0", "r0c1"):
            for p in host.slots[slot_id].seed.parameters():
                p.normal_(0, 0.5)
    return host.eval()


def test_plan_measures_blending_slots_only():
    host = _grown_host()
    plan = make_plan(host.slots)
    assert plan.slot_ids == ("r0c0", "r0c1")
    assert plan.configs == (MAIN, "off:r0c0", "off:r0c1", ALL_OFF)
    a1 = host.slots["r0c1"].alpha
    assert plan.alphas["r0c0"].tolist() == [1.0, 0.0, 1.0, 0.0]
    torch.testing.assert_close(plan.alphas["r0c1"], torch.tensor([a1, a1, 0.0, 0.0]))
    assert make_plan(CifarCNNHost("baseline").slots).configs == (MAIN,)


def test_fused_forward_equals_separate_passes():
    host = _grown_host()
    plan = make_plan(host.slots)
    x = torch.randn(16, 3, 32, 32)
    y = torch.randint(0, 10, (16,))
    fused = fused_forward(host, x, host.slots, plan)
    with torch.no_grad():
        for k in range(plan.size):
            # Reference: a separate model whose slots really have these alphas.
            ref = copy.deepcopy(host)
            for sid in plan.slot_ids:
                ref.slots[sid].alpha_controller.snap(float(plan.alphas[sid][k]))
            torch.testing.assert_close(fused[k], ref(x), rtol=1e-5, atol=1e-5)
    acc = CounterfactualAccumulator(plan)
    acc.update(host, x, y, host.slots)
    separate = {}
    for k, config in enumerate(plan.configs):
        separate[config] = 100.0 * float((fused[k].argmax(-1) == y).float().mean())
    assert acc.accuracies() == separate
    contributions = acc.contributions()
    assert contributions["r0c0"] == separate[MAIN] - separate["off:r0c0"]
    assert host.slots["r1c2"].stage == SeedStage.GERMINATED


def test_overrides_do_not_leak_after_the_fused_pass():
    host = _grown_host()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        before = host(x)
        fused_forward(host, x, host.slots, make_plan(host.slots))
        assert torch.equal(host(x), before)


def test_fused_pass_runs_one_forward_and_the_prefix_once():
    host = _grown_host()
    rows = {}
    for name in ("blocks.0", "blocks.1", "head"):
        module = host.get_submodule(name)
        module.register_forward_hook(lambda m, i, o, name=name: rows.setdefault(name, []).append(
            i[0].shape[0]))
    with torch.no_grad():
        fused_forward(host, torch.randn(8, 3, 32, 32), host.slots, make_plan(host.slots))
    # Block 0 runs before the first measured slot (r0c0): once, on the plain batch.
    assert rows == {"blocks.0": [8], "blocks.1": [8 * 4], "head": [8 * 4]}


def test_contribution_is_zero_when_seed_is_identity():
    host = CifarCNNHost("baseline", slots=["r0c1"]).eval()
    _blend(host, "r0c1", "norm", ticks=5)
    with torch.no_grad():
        for p in host.slots["r0c1"].seed.parameters():
            p.zero_()  # norm seed with tanh(0)=0 is exactly the identity
    acc = CounterfactualAccumulator(make_plan(host.slots))
    acc.update(host, torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)), host.slots)
    assert acc.contributions() == {"r0c1": 0.0}
    assert isinstance(host.slots["r0c1"], nn.Module)


# --- separate passes: the default for any module -----------------------------------------------
def test_separate_and_fused_give_the_same_accuracies_and_contributions():
    host = _grown_host()
    torch.manual_seed(1)
    batches = [(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))) for _ in range(3)]
    results = {}
    for mode in MODES:
        acc = CounterfactualAccumulator(make_plan(host.slots), mode)
        for x, y in batches:
            acc.update(host, x, y, host.slots)
        accuracies, loss, _ = acc.read()
        results[mode] = (accuracies, acc.contributions(accuracies), loss)
    assert results["separate"][:2] == results["fused"][:2]
    assert results["separate"][2] == pytest.approx(results["fused"][2], rel=1e-5)
    assert set(results["fused"][1]) == {"r0c0", "r0c1"}
    assert any(c != 0 for c in results["fused"][1].values())  # the seeds matter


def test_separate_passes_keep_the_batch_shape_and_match_real_alphas():
    host = _grown_host()
    plan = make_plan(host.slots)
    rows = []
    host.head.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        out = separate_forward(host, x, host.slots, plan)  # [K, B, classes]
        assert rows == [8] * plan.size and out.shape == (plan.size, 8, 10)
        for k in range(plan.size):
            ref = copy.deepcopy(host)
            for sid in plan.slot_ids:
                ref.slots[sid].alpha_controller.snap(float(plan.alphas[sid][k]))
            torch.testing.assert_close(out[k], ref(x), rtol=1e-5, atol=1e-5)


def test_default_mode_per_device_and_bad_modes():
    assert default_mode("cpu") == DEFAULT_MODES["cpu"] and default_mode("cuda:1") in MODES
    assert CounterfactualAccumulator(make_plan({})).mode is None  # picked at the first batch
    with pytest.raises(ValueError, match="unknown counterfactual mode 'both'; accepted: "
                                         "separate, fused"):
        CounterfactualAccumulator(make_plan({}), "both")


def test_token_level_logits_count_every_token():
    # A [B, T, classes] classifier (the GPT host): accuracy and loss over all B*T tokens.
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)  # [B, T, C]
    y = torch.randint(0, 7, (3, 5))
    acc = CounterfactualAccumulator(make_plan({}), "separate")
    acc.update(lambda x: x, logits, y, {})
    accuracies, loss, _ = acc.read()
    expected = 100.0 * float((logits.argmax(-1) == y).float().mean())
    assert accuracies == {MAIN: pytest.approx(expected)} and acc.total == 15
    assert loss == pytest.approx(float(F.cross_entropy(logits.reshape(15, 7), y.reshape(15))))


@pytest.mark.parametrize(
    ("output", "targets", "message"),
    [
        ((torch.zeros(4, 10), torch.zeros(4, 3)), torch.zeros(4, dtype=torch.long),
         "the forward returned a tuple, not a logits tensor"),
        (torch.zeros(4, 10), torch.zeros(4, 2, dtype=torch.long),
         r"logits of shape \(4, 10\) do not match class targets of shape \(4, 2\)"),
        (torch.zeros(4, 10), torch.zeros(4), "targets must be class indices"),
    ],
    ids=["tuple", "shape", "float_targets"],
)
def test_outputs_that_are_not_logits_are_refused_in_one_line(output, targets, message):
    acc = CounterfactualAccumulator(make_plan({}), "separate")
    with pytest.raises(LogitsError, match=message):
        acc.update(lambda x: output, torch.zeros(4, 3), targets, {})


def test_the_probe_fans_out_at_the_first_slot_even_without_a_seed():
    host = CifarCNNHost("baseline", slots=["r0c1", "r0c2"]).eval()  # no seeds at all
    plan = probe_plan(host.slots)
    assert plan.slot_ids == ("r0c1", "r0c2") and plan.size == 2
    rows = {}
    for name in ("blocks.1", "head"):
        host.get_submodule(name).register_forward_hook(
            lambda m, i, o, name=name: rows.setdefault(name, []).append(i[0].shape[0]))
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        out = fused_forward(host, x, host.slots, plan)
        torch.testing.assert_close(out[1], host(x))  # same outputs as a plain forward
    assert rows["blocks.1"][0] == 4 and rows["head"][0] == 8  # fanned out at r0c1


def test_reduced_shards_give_the_whole_sets_counts_not_a_mean_of_ratios():
    host = _grown_host()
    torch.manual_seed(2)
    x, y = torch.randn(24, 3, 32, 32), torch.randint(0, 10, (24,))
    whole = CounterfactualAccumulator(make_plan(host.slots), "separate")
    whole.update(host, x, y, host.slots)
    shards = [CounterfactualAccumulator(make_plan(host.slots), "separate") for _ in range(3)]
    shards[0].update(host, x[:16], y[:16], host.slots)  # unequal shards: 16, 8 and none
    shards[1].update(host, x[16:], y[16:], host.slots)
    parts: list[torch.Tensor] = []
    for shard in shards:  # what each rank contributes to the collective
        shard.reduce(lambda t: parts.append(t.clone()) or t, torch.device("cpu"))
    for shard in shards:  # the collective: every rank gets the sum
        shard.reduce(lambda t: torch.stack(parts).sum(0), torch.device("cpu"))
    for shard in shards:
        assert shard.total == 24 and torch.equal(shard.correct, whole.correct)
        assert shard.accuracies() == whole.accuracies()
        assert shard.read()[1] == pytest.approx(whole.read()[1], rel=1e-6)
        assert torch.equal(shard.flips, whole.flips)
        assert shard.standard_errors() == whole.standard_errors()


def test_the_standard_error_is_the_paired_differences_over_the_examples():
    """Each example scores +1 where the seed turns it right, -1 where it turns it wrong: the
    contribution is their mean (points) and its standard error the one of that mean, counted
    here example by example from each configuration's own predictions."""
    host = _grown_host()
    torch.manual_seed(3)
    batches = [(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))) for _ in range(3)]
    plan = make_plan(host.slots)
    errors = {}
    for mode in MODES:
        acc = CounterfactualAccumulator(plan, mode)
        for x, y in batches:
            acc.update(host, x, y, host.slots)
        contributions, errors[mode] = acc.contributions(), acc.standard_errors()
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    with torch.no_grad():
        main = host(x).argmax(-1) == y
        for sid in plan.slot_ids:
            with host.slots[sid].alpha_override(torch.tensor(0.0)):
                off = host(x).argmax(-1) == y
            paired = 100.0 * (main.double() - off.double())  # [48], points
            assert contributions[sid] == pytest.approx(paired.mean().item())
            expected = paired.std(correction=0).item() / len(paired) ** 0.5
            assert (paired != 0).any()  # the seed turns some example: not trivially zero
            assert errors["separate"][sid] == pytest.approx(expected, rel=1e-12)
    assert errors["separate"] == errors["fused"]


# --- language models: every token counts ---------------------------------------------------------
def test_batches_of_different_sizes_give_the_exact_token_weighted_mean():
    # Per-batch means averaged over batches (what the research code's fused validation did)
    # weigh a 1-block batch like a 3-block one; the accumulator counts tokens.
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(3, 5, 7, generator=g), torch.randint(0, 7, (3, 5), generator=g)),
               (torch.randn(1, 5, 7, generator=g), torch.randint(0, 7, (1, 5), generator=g)),
               (torch.randn(2, 4, 7, generator=g), torch.randint(0, 7, (2, 4), generator=g))]
    acc = CounterfactualAccumulator(make_plan({}), "separate")
    for logits, y in batches:
        acc.update(lambda x: x, logits, y, {})
    accuracies, loss, _ = acc.read()
    flat = torch.cat([logits.reshape(-1, 7) for logits, _ in batches])  # [28, 7]
    targets = torch.cat([y.reshape(-1) for _, y in batches])  # [28]
    assert acc.total == 15 + 5 + 8 == targets.numel()
    hits = int((flat.argmax(-1) == targets).sum())
    assert accuracies[MAIN] == pytest.approx(100.0 * hits / 28)
    assert loss == pytest.approx(float(F.cross_entropy(flat, targets)), rel=1e-6)
    per_batch = [float(F.cross_entropy(lg.reshape(-1, 7), y.reshape(-1))) for lg, y in batches]
    assert abs(sum(per_batch) / 3 - loss) > 1e-3  # the per-batch mean is another number


def _blend_gpt(host, slot_id: str, blueprint: str, algorithm, ticks: int) -> None:
    slot = host.slots[slot_id]
    slot.germinate(blueprint, algorithm=algorithm, tempo=4)
    slot.advance()
    slot.state.metrics.epochs_in_stage = 10
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    assert slot.advance().passed  # -> BLENDING
    for _ in range(ticks):
        slot.tick()


def _grown_gpt():
    """The tiny GPT host with an ADD attention seed mid-ramp after block 0 and a GATE MLP seed
    fully blended (HOLDING) after block 1, both large enough to change predictions."""
    torch.manual_seed(0)
    host = GPTHost("tiny", slots=["r0c0", "r0c1"])
    _blend_gpt(host, "r0c0", "attention", AlphaAlgorithm.ADD, ticks=2)
    _blend_gpt(host, "r0c1", "mlp_small", AlphaAlgorithm.GATE, ticks=4)
    host.slots["r0c1"].advance()  # -> HOLDING at alpha 1
    with torch.no_grad():
        for slot_id in ("r0c0", "r0c1"):
            for p in host.slots[slot_id].seed.parameters():
                p.normal_(0, 0.5)
    return host.eval()


def test_gpt_fused_equals_separate_passes_with_add_and_gate_seeds():
    host = _grown_gpt()
    assert host.slots["r0c0"].blend.algorithm == AlphaAlgorithm.ADD
    assert host.slots["r0c1"].blend.algorithm == AlphaAlgorithm.GATE
    assert host.slots["r0c1"].stage == SeedStage.HOLDING and 0 < host.slots["r0c0"].alpha < 1
    plan = make_plan(host.slots)
    assert plan.configs == (MAIN, "off:r0c0", "off:r0c1", ALL_OFF)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (3, 16), generator=g)
    with torch.no_grad():
        fused = fused_forward(host, x, host.slots, plan)  # [K, B, T, V]
        separate = separate_forward(host, x, host.slots, plan)
        torch.testing.assert_close(fused, separate, rtol=1e-4, atol=1e-4)
        for k in range(plan.size):
            ref = copy.deepcopy(host)  # the slots really at this configuration's alphas
            for sid in plan.slot_ids:
                ref.slots[sid].alpha_controller.snap(float(plan.alphas[sid][k]))
            torch.testing.assert_close(separate[k], ref(x), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(separate[0], separate[1], atol=1e-3)  # the seeds matter


def test_gpt_contribution_is_token_accuracy_and_the_loss_is_the_main_configurations():
    host = _grown_gpt()
    plan = make_plan(host.slots)
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, 256, (b, 16), generator=g),
                torch.randint(0, 256, (b, 16), generator=g)) for b in (4, 1)]
    with torch.no_grad():
        # Targets the host gets right part of the time: its own predictions, half of them.
        batches = [(x, torch.where(torch.rand(y.shape, generator=g) < 0.5,
                                   separate_forward(host, x, host.slots, plan)[2].argmax(-1), y))
                   for x, y in batches]
        logits = [separate_forward(host, x, host.slots, plan) for x, _ in batches]
    targets = torch.cat([y.reshape(-1) for _, y in batches])  # [80] tokens
    expected = {}
    for k, config in enumerate(plan.configs):
        flat = torch.cat([lg[k].reshape(-1, 256) for lg in logits])
        expected[config] = 100.0 * float((flat.argmax(-1) == targets).double().mean())
    main_loss = float(F.cross_entropy(torch.cat([lg[0].reshape(-1, 256) for lg in logits]),
                                      targets))
    results = {}
    for mode in MODES:
        acc = CounterfactualAccumulator(plan, mode)
        for x, y in batches:
            acc.update(host, x, y, host.slots)
        accuracies, loss, _ = acc.read()
        results[mode] = acc.contributions(accuracies)
        assert acc.total == 80
        assert accuracies == pytest.approx(expected)
        assert loss == pytest.approx(main_loss, rel=1e-5)
    assert results["fused"] == pytest.approx(results["separate"])
    contributions = results["separate"]
    assert contributions == pytest.approx({
        "r0c0": expected[MAIN] - expected["off:r0c0"],
        "r0c1": expected[MAIN] - expected["off:r0c1"]})
    assert contributions["r0c1"] != 0.0  # measured, not trivially zero
