import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifecycle_mdp import (
    EPISODE_LENGTH,
    LifecycleMDP,
    collect_rollout,
    make_report,
)

from esper_lightning.blueprints import blueprint_index
from esper_lightning.core.actions import (
    CAUSAL_RELEVANCE,
    HEADS,
    Action,
    AlphaTargetChoice,
    LifecycleOp,
    MaskContext,
    action_error,
)
from esper_lightning.core.engine import execute_on_slot
from esper_lightning.core.slots import SeedSlot
from esper_lightning.rl import (
    FactoredRecurrentActorCritic,
    MaskedCategorical,
    PolicyConfig,
    RolloutBuffer,
    RunningMeanStd,
    batch_observations,
    obs_dim,
    stack_masks,
)

CONFIG = PolicyConfig(n_slots=2, hidden_dim=32, head_hidden_dim=32)


def _policy(seed: int = 0, **overrides) -> FactoredRecurrentActorCritic:
    torch.manual_seed(seed)
    config = PolicyConfig(**{**CONFIG.__dict__, **overrides})
    return FactoredRecurrentActorCritic(config)


def _fresh_inputs(n: int):
    report = make_report([SeedSlot("r0c0", channels=2), SeedSlot("r0c1", channels=2)])
    return batch_observations([report] * n)


# --- masked categorical ----------------------------------------------------------------------
def test_masked_categorical_gives_zero_mass_to_masked_actions():
    logits = torch.tensor([[5.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[False, True, True], [True, True, True]])
    dist = MaskedCategorical(logits, mask)
    assert dist.log_probs_all.dtype == torch.float32
    probs = dist.log_probs_all.exp()
    assert probs[0, 0] == 0.0
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))
    assert dist.mode().tolist() == [2, 0]
    torch.testing.assert_close(dist.normalized_entropy()[1], torch.tensor(1.0))
    samples = torch.stack([dist.sample() for _ in range(200)])
    assert not (samples[:, 0] == 0).any()
    with pytest.raises(ValueError, match="forbids"):
        dist.log_prob(torch.tensor([0, 1]))


def test_single_legal_action_has_log_prob_and_entropy_exactly_zero():
    dist = MaskedCategorical(torch.randn(4, 5), torch.eye(5, dtype=torch.bool)[:4])
    assert dist.log_prob(torch.arange(4)).eq(0).all()
    assert dist.entropy().eq(0).all() and dist.normalized_entropy().eq(0).all()


def test_all_false_mask_raises():
    mask = torch.tensor([[True, False], [False, False]])
    with pytest.raises(ValueError, match="no legal action"):
        MaskedCategorical(torch.zeros(2, 2), mask)


def test_policy_refuses_an_all_false_op_mask():
    raw, indices, masks = _fresh_inputs(2)
    masks.op[1] = False
    policy = _policy()
    with pytest.raises(ValueError, match="no legal action"):
        policy.act(raw, indices, masks, policy.initial_state(2))


# --- conditioned masks -----------------------------------------------------------------------
def test_mask_batch_conditioning_matches_action_masks():
    slots = [SeedSlot("r0c0", channels=2), SeedSlot("r0c1", channels=2)]
    slots[1].germinate("norm")
    masks = make_report(slots).masks
    batch = stack_masks([masks] * len(LifecycleOp))
    ops = torch.arange(len(LifecycleOp))
    for name in HEADS:
        conditioned = batch.head(name, ops).numpy()
        for op in LifecycleOp:
            expected = masks.head(name, op)
            if name == "slot" and "slot" not in CAUSAL_RELEVANCE[op]:
                first = int(np.flatnonzero(expected)[0])  # irrelevant slot: first legal one
                expected = np.eye(len(expected), dtype=bool)[first]
            np.testing.assert_array_equal(conditioned[op], expected, err_msg=f"{name} {op!r}")


def test_irrelevant_slot_collapses_to_the_first_legal_slot():
    masks = make_report([SeedSlot(f"r0c{i}", channels=2) for i in range(3)]).masks
    batch = stack_masks([masks])
    batch.slot_by_op[0, LifecycleOp.WAIT] = torch.tensor([False, False, True])  # synthetic
    wait = torch.tensor([int(LifecycleOp.WAIT)])
    assert batch.head("slot", wait).tolist() == [[False, False, True]]


# --- acting ----------------------------------------------------------------------------------
def test_act_shapes_and_irrelevant_heads():
    raw, indices, masks = _fresh_inputs(64)
    policy = _policy()
    out = policy.act(raw, indices, masks, policy.initial_state(64))
    assert out.actions.shape == (64, 8) and out.actions.dtype == torch.long
    assert out.log_probs.shape == (64, 8) and out.value.shape == (64,)
    assert out.hidden[0].shape == (64, CONFIG.hidden_dim)
    for row, log_probs in zip(out.actions.tolist(), out.log_probs, strict=True):
        action = Action.from_indices(row)
        for i, head in enumerate(HEADS):
            if not action.relevant(head):
                assert log_probs[i] == 0.0
                if head == "slot":
                    assert action.slot == 0
                else:
                    assert getattr(action, head) == getattr(Action(), head)
    assert {LifecycleOp(op) for op in out.actions[:, 0].tolist()} == {
        LifecycleOp.WAIT, LifecycleOp.GERMINATE
    }


def test_per_env_generators_make_an_envs_draws_independent_of_the_batch():
    raw, indices, masks = _fresh_inputs(64)
    policy = _policy()

    def draws(rows: slice) -> torch.Tensor:
        generators = [torch.Generator().manual_seed(1000 + i) for i in range(64)[rows]]
        hidden = policy.initial_state(len(generators))
        return policy.act(raw[rows], indices[rows], masks.index(rows), hidden,
                          generators=generators).actions

    global_state = torch.get_rng_state()
    whole = draws(slice(None))
    assert torch.equal(torch.get_rng_state(), global_state)  # the global stream is untouched
    assert torch.equal(draws(slice(32, None)), whole[32:])  # another "rank" with half the envs
    assert len(set(map(tuple, whole.tolist()))) > 1  # the streams differ between envs


def test_initial_policy_is_near_uniform_over_legal_actions():
    raw, indices, masks = _fresh_inputs(1)
    policy = _policy()
    out = policy.act(raw, indices, masks, policy.initial_state(1))
    op_log_prob = float(out.log_probs[0, 0])
    assert op_log_prob == pytest.approx(np.log(1 / 2), abs=0.02)  # WAIT or GERMINATE


def test_deterministic_act_is_repeatable():
    raw, indices, masks = _fresh_inputs(3)
    policy = _policy(value_head_gain=1.0, policy_head_gain=2.0)
    first = policy.act(raw, indices, masks, policy.initial_state(3), deterministic=True)
    again = policy.act(raw, indices, masks, policy.initial_state(3), deterministic=True)
    assert torch.equal(first.actions, again.actions)
    assert torch.equal(first.actions[0], first.actions[1])


def test_episode_starts_zero_the_hidden_state():
    raw, indices, masks = _fresh_inputs(2)
    policy = _policy()
    carried = (torch.randn(2, CONFIG.hidden_dim), torch.randn(2, CONFIG.hidden_dim))
    fresh = policy.act(raw, indices, masks, policy.initial_state(2))
    reset = policy.act(raw, indices, masks, carried, episode_starts=torch.tensor([True, False]))
    assert torch.equal(reset.value[0], fresh.value[0])
    assert not torch.equal(reset.value[1], fresh.value[1])


def test_blueprint_index_outside_the_table_raises():
    raw, indices, masks = _fresh_inputs(1)
    policy = _policy()
    with pytest.raises(ValueError, match="blueprint index"):
        policy.act(raw, indices + 20, masks, policy.initial_state(1))
    with pytest.raises(ValueError, match="blueprint index"):
        policy.act(raw, indices - 1, masks, policy.initial_state(1))


def test_preserve_value_outputs_keeps_denormalised_predictions():
    raw, indices, masks = _fresh_inputs(4)
    policy = _policy()
    before = policy.act(raw, indices, masks, policy.initial_state(4)).value * 2.0 + 1.0
    policy.preserve_value_outputs(old_mean=1.0, old_std=2.0, new_mean=-3.0, new_std=0.5)
    after = policy.act(raw, indices, masks, policy.initial_state(4)).value * 0.5 - 3.0
    torch.testing.assert_close(after, before)


# --- re-evaluation -----------------------------------------------------------------------------
def _two_episode_rollout(policy: FactoredRecurrentActorCritic) -> RolloutBuffer:
    """Rows hold two episodes each, so episode starts happen mid-row with a carried state."""
    torch.manual_seed(1)
    envs = [LifecycleMDP(start) for start in ("clean", "harmful", "harmful")]
    buffer = RolloutBuffer(len(envs), 2 * EPISODE_LENGTH, policy.config)
    obs_rms = RunningMeanStd(shape=(obs_dim(2),))
    obs_rms.update(torch.randn(50, obs_dim(2)))
    collect_rollout(policy, obs_rms, envs, buffer)
    return buffer


def _evaluate(policy, buffer, episode_starts):
    with torch.no_grad():
        return policy.evaluate(
            buffer.obs, buffer.blueprint_idx, buffer.actions, buffer.masks,
            (buffer.hidden_h[:, 0], buffer.hidden_c[:, 0]), episode_starts,
        )


def test_evaluate_reproduces_rollout_log_probs_and_values():
    policy = _policy(policy_head_gain=1.0)  # non-uniform policy: log-probs carry information
    buffer = _two_episode_rollout(policy)
    assert buffer.episode_starts[:, EPISODE_LENGTH].all()
    new = _evaluate(policy, buffer, buffer.episode_starts)
    torch.testing.assert_close(new.log_probs, buffer.log_probs, rtol=0, atol=1e-5)
    torch.testing.assert_close(new.values, buffer.values, rtol=0, atol=1e-5)
    assert new.entropy.shape == buffer.log_probs.shape
    assert (new.entropy >= 0).all() and (new.entropy <= 1 + 1e-6).all()
    # The hidden-state handling matters: ignoring the mid-row episode starts changes values.
    starts_ignored = torch.zeros_like(buffer.episode_starts)
    starts_ignored[:, 0] = True
    wrong = _evaluate(policy, buffer, starts_ignored)
    assert (wrong.values[:, EPISODE_LENGTH:] - buffer.values[:, EPISODE_LENGTH:]).abs().max() > 1e-3


def _unrolled(policy, x, hidden, starts):
    """The LSTM core stepped one decision at a time, written out independently of `_core`: both
    h and c zeroed before step t wherever ``starts[:, t]``."""
    h, c = hidden
    outputs = []
    for t in range(x.shape[1]):
        keep = (~starts[:, t]).float()[:, None]
        y, (h_n, c_n) = policy.lstm(x[:, t : t + 1], ((h * keep)[None], (c * keep)[None]))
        h, c = h_n[0], c_n[0]
        outputs.append(y)
    return x + policy.lstm_norm(torch.cat(outputs, dim=1)), (h, c)


def test_the_lstm_over_stretches_equals_the_step_by_step_unroll():
    """`_core` runs one LSTM call per stretch without an episode start; envs here start
    episodes at different steps (and one twice in a row), so the stretches cut every row."""
    policy = _policy()
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, 9, CONFIG.hidden_dim, generator=generator)
    hidden = (torch.randn(4, CONFIG.hidden_dim, generator=generator),
              torch.randn(4, CONFIG.hidden_dim, generator=generator))
    starts = torch.zeros(4, 9, dtype=torch.bool)
    starts[0, 0] = starts[1, 3] = starts[2, 5] = starts[2, 6] = starts[3, 8] = True
    with torch.no_grad():
        whole, state = policy._core(x, hidden, starts)
        reference, reference_state = _unrolled(policy, x, hidden, starts)
        one_step, one_state = policy._core(x[:, :1], hidden, starts[:, :1])  # acting
        ignored, _ = policy._core(x, hidden, torch.zeros_like(starts))
    torch.testing.assert_close(whole, reference, rtol=0, atol=1e-6)
    torch.testing.assert_close(state, reference_state, rtol=0, atol=1e-6)
    torch.testing.assert_close((one_step, one_state), _unrolled(policy, x[:, :1], hidden,
                                                                starts[:, :1]), rtol=0, atol=1e-6)
    # The starts matter: without them the rows that restart differ after their start.
    assert (ignored[1, 3:] - whole[1, 3:]).abs().max() > 1e-3
    torch.testing.assert_close(ignored[1, :3], whole[1, :3], rtol=0, atol=1e-6)


def test_evaluate_gives_zero_entropy_to_irrelevant_heads():
    policy = _policy()
    buffer = _two_episode_rollout(policy)
    new = _evaluate(policy, buffer, buffer.episode_starts)
    waits = buffer.actions[..., 0] == LifecycleOp.WAIT
    assert waits.any()
    assert new.entropy[waits][:, 1:].eq(0).all() and new.log_probs[waits][:, 1:].eq(0).all()


# --- property: the sampler never proposes an illegal action -----------------------------------
_walk_step = st.tuples(
    st.integers(0, 10_000),  # which legal (op, slot) pair to apply
    st.sampled_from([True, True, True, False]),  # healthy gradients
    st.floats(-3.0, 3.0),  # counterfactual contribution
    st.integers(0, 4),  # epochs to tick afterwards
)
_CONTEXT = MaskContext(blueprints=("norm", "depthwise"), max_seeds=2)


def _legal_action(choice: int, report) -> Action:
    """A legal (op, slot) pair picked by ``choice``; WAIT only when nothing else is legal and
    PRUNE rarely, so walks reach deep stages (HOLDING, FOSSILIZED) as well as the embargo."""
    legal = report.masks.slot_by_op.copy()
    legal[LifecycleOp.WAIT] = False
    if choice % 8:
        legal[LifecycleOp.PRUNE] = False
    pairs = np.argwhere(legal)
    if not len(pairs):
        return Action()
    op, slot = pairs[choice % len(pairs)]
    return Action(
        LifecycleOp(int(op)),
        slot=int(slot),
        blueprint=("norm", "depthwise")[choice % 2],
        tempo=choice % 3,
        alpha_target=AlphaTargetChoice.FULL if choice % 4 else AlphaTargetChoice.HALF,
        alpha_speed=choice % 4,
    )


def _feed(slot: SeedSlot, healthy: bool, contribution: float) -> None:
    if slot.seed is None:
        return
    metrics = slot.state.metrics
    metrics.gradient_health, metrics.has_exploding = (1.0, False) if healthy else (0.2, True)
    slot.record_accuracy(50.0 + contribution)
    if slot.alpha > 0:
        slot.record_contribution(contribution)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_walk_step, min_size=10, max_size=40))
def test_sampled_actions_are_always_legal_on_reachable_states(walk):
    slots = [SeedSlot(f"r0c{i}", channels=2) for i in range(3)]
    # Peaked, state-dependent logits, so sampling and argmax explore many legal actions.
    policy_config = PolicyConfig(n_slots=3, hidden_dim=16, head_hidden_dim=16,
                                 policy_head_gain=3.0)
    torch.manual_seed(len(walk))
    policy = FactoredRecurrentActorCritic(policy_config)
    for choice, healthy, contribution, ticks in walk:
        report = make_report(slots, context=_CONTEXT)
        masks = report.masks
        assert masks.op.any()
        # One observation of the state, on 16 rows (built once: the rows are the same state).
        rows = torch.zeros(16, dtype=torch.long)
        raw, indices, batch = batch_observations([report])
        raw, indices, batch = raw[rows], indices[rows], batch.index(rows)
        # Every legal op on at least two of the 16 rows (at most 6 ops are legal): one call per
        # head checks each (op, head) pair, where a call per op and head checked the same pairs.
        legal_ops = torch.from_numpy(np.flatnonzero(masks.op))
        ops = legal_ops[torch.arange(16) % len(legal_ops)]
        for head in HEADS:
            assert batch.head(head, ops).any(-1).all(), (head, legal_ops.tolist())
        for deterministic in (False, True):
            out = policy.act(raw, indices, batch, policy.initial_state(16), deterministic)
            # Each distinct proposal checked once: the 16 rows repeat a few actions.
            for row in sorted(set(map(tuple, out.actions.tolist()))):
                action = Action.from_indices(row)
                assert action_error(action, report.slots, _CONTEXT) is None, action.describe()
                assert masks.allows(action)
        action = _legal_action(choice, report)
        if action_error(action, report.slots, _CONTEXT) is None:
            execute_on_slot(slots[action.slot], action)
        for _ in range(ticks):
            for slot in slots:
                _feed(slot, healthy, contribution)
                slot.tick()


def test_the_policy_samples_no_germination_its_slot_cannot_host():
    from esper_lightning.core.engine import MorphogenesisEngine
    from esper_lightning.hosts import GPTHost

    engine = MorphogenesisEngine(GPTHost("grow2", slots=("r0c0", "r1c0")), rng_seed=0)
    report = engine.report(max_epochs=10)
    n = 256
    raw, indices, masks = batch_observations([report] * n)
    torch.manual_seed(0)
    policy = FactoredRecurrentActorCritic(PolicyConfig(n_slots=2, hidden_dim=16,
                                                       head_hidden_dim=16))
    # Every germination, on either slot, with any blueprint some slot hosts.
    with torch.no_grad():
        policy.heads["op"][-1].bias[LifecycleOp.GERMINATE] = 20.0
    out = policy.act(raw, indices, masks, policy.initial_state(n))
    germinate = out.actions[:, 0] == LifecycleOp.GERMINATE
    assert germinate.all() and set(out.actions[:, 1].tolist()) == {0, 1}
    plain = {int(b) for b in out.actions[out.actions[:, 1] == 0, 2]}
    growth = {blueprint_index(name) for name in report.mask_context.slot_refuses[0]}
    assert plain and growth and not plain & growth  # no block_* seed in the plain slot
    for row in out.actions.tolist():
        action = Action.from_indices(row)
        assert report.masks.allows(action), action.describe()
    # The update re-applies the slot-conditioned mask: log-probs match the rollout's.
    evaluation = policy.evaluate(raw[:, None], indices[:, None], out.actions[:, None],
                                 masks.index((slice(None), None)), policy.initial_state(n),
                                 torch.ones(n, 1, dtype=torch.bool))
    torch.testing.assert_close(evaluation.log_probs[:, 0], out.log_probs)
