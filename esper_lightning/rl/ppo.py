"""Recurrent PPO for the factored lifecycle policy (clipped surrogate, Schulman et al. 2017).

One call of `ppo_update` consumes one full `RolloutBuffer` (a round):

1. scale rewards (optional running-std reward normaliser, updated once here);
2. de-normalise the stored values, compute GAE advantages and returns;
3. update the value normaliser with the returns, rescale the value head so its de-normalised
   outputs do not jump (PopArt), normalise the value targets with mean and std;
4. for ``n_epochs`` epochs, over shuffled minibatches of WHOLE env sequences (recurrent: each
   minibatch is unrolled from its stored initial hidden state, never shuffled inside a
   sequence), take one Adam step on the clipped per-head surrogate + value loss − entropy bonus;
   after each epoch measure the joint approximate KL on the whole batch against the rollout
   policy and stop when it exceeds the target.

Factored heads: the policy's log-prob is the sum of the per-head log-probs of the heads that are
causally relevant to the stored op (the others have log-prob exactly 0). Each head gets its own
clipped ratio, and a head only counts at the steps where it is relevant; the policy loss is the
per-step sum over relevant heads averaged over steps, i.e. a sparse head (blueprint: only on
GERMINATE) weighs in proportion to how often it acts instead of being inflated by a per-head mean.

Data-parallel (DD-PPO): ``all_reduce`` sums a tensor over the ranks; each rank updates on its own
envs' sequences and every quantity is that of the whole batch of all ranks: the minibatches (one
partition of every rank's envs, drawn alike on every rank, `minibatches`), normaliser moments,
the advantage mean and std of each minibatch, the loss (each rank's part is its sum divided by
the global count, so the gradients summed over the ranks are those of the whole minibatch; one
flat all-reduce per minibatch), the KL that stops the update (so every rank takes the same
number of steps) and the logged metrics. One process is the world of one rank: its all-reduce
is `single_process` (the identity, the default), so every test of the update runs the formulas
a data-parallel run uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from esper_lightning.core.actions import HEADS
from esper_lightning.rl.buffer import RolloutBuffer, compute_gae
from esper_lightning.rl.distributions import RELEVANCE
from esper_lightning.rl.normalizers import (
    AllReduce,
    RewardNormalizer,
    ValueNormalizer,
    batch_moments,
    single_process,
)
from esper_lightning.rl.policy import Evaluation, FactoredRecurrentActorCritic


def _default_entropy_coefs() -> dict[str, float]:
    # Per-head multipliers (x 0.01): heads that act rarely (blueprint, tempo) get a
    # little more exploration pressure because they receive fewer policy-gradient samples.
    weights = {"op": 1.0, "slot": 1.0, "blueprint": 1.3, "tempo": 1.3}
    return {head: 0.01 * weights.get(head, 1.2) for head in HEADS}


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyper-parameters. The reasons for each default are in ``docs/rl.md``.

    Attributes:
        learning_rate: Adam step size.
        adam_eps: Adam epsilon (1e-5 as in CleanRL / the PPO implementation details).
        gamma: discount; the shaped reward's PBRS gamma must be the same.
        gae_lambda: GAE lambda.
        clip_coef: PPO ratio clip epsilon, applied per head.
        n_epochs: passes over the rollout per update.
        minibatch_envs: env sequences per minibatch (whole sequences, recurrent), counted over
            every rank's envs.
        target_kl: stop the update after an epoch whose joint approx KL over the whole batch
            exceeds this (None: never stop early).
        vf_coef: weight of the value loss.
        entropy_coefs: weight of each head's normalised entropy bonus.
        max_grad_norm: global gradient-norm clip.
        norm_adv: normalise advantages per minibatch.
    """

    learning_rate: float = 3e-4
    adam_eps: float = 1e-5
    gamma: float = 0.995
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    n_epochs: int = 4
    minibatch_envs: int = 2
    target_kl: float | None = 0.015
    vf_coef: float = 0.5
    entropy_coefs: dict[str, float] = field(default_factory=_default_entropy_coefs)
    max_grad_norm: float = 0.5
    norm_adv: bool = True

    def __post_init__(self) -> None:
        if set(self.entropy_coefs) != set(HEADS):
            raise ValueError(f"entropy_coefs needs exactly the heads {HEADS}")
        if self.minibatch_envs < 1 or self.n_epochs < 1:
            raise ValueError("minibatch_envs and n_epochs must be >= 1")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ValueError(f"target_kl must be > 0 or None, got {self.target_kl}")


def make_optimizer(policy: nn.Module, config: PPOConfig) -> torch.optim.Adam:
    """Adam over every policy parameter with the configured lr and epsilon."""
    return torch.optim.Adam(policy.parameters(), lr=config.learning_rate, eps=config.adam_eps)


def explained_variance(
    predicted: Tensor, target: Tensor, all_reduce: AllReduce = single_process
) -> float:
    """``1 - Var(target - predicted) / Var(target)`` over every rank's values; NaN when the
    target is constant."""
    var_target = batch_moments(target.reshape(-1).double(), all_reduce)[1]
    var_residual = batch_moments((target - predicted).reshape(-1).double(), all_reduce)[1]
    if float(var_target) == 0.0:
        return float("nan")
    return float(1.0 - var_residual / var_target)


def ppo_update(
    policy: FactoredRecurrentActorCritic,
    optimizer: torch.optim.Optimizer,
    buffer: RolloutBuffer,
    config: PPOConfig,
    value_normalizer: ValueNormalizer,
    reward_normalizer: RewardNormalizer | None = None,
    all_reduce: AllReduce = single_process,
    *,
    rank: int = 0,
    world_size: int = 1,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """One PPO update on a full buffer; returns CleanRL-named metrics (see ``docs/rl.md``).

    Minibatches are drawn from ``generator`` (None: the global torch RNG). Data-parallel, this
    is rank ``rank`` of ``world_size``'s part (module docstring): every rank passes as many envs,
    the same ``config`` and an equally seeded ``generator``, and ends with the policy of one
    process holding every rank's envs."""
    if not buffer.full:
        raise RuntimeError(f"ppo_update on a buffer with {buffer.step}/{buffer.n_steps} steps")
    rewards = buffer.rewards
    if reward_normalizer is not None:
        reward_normalizer.update(buffer.rewards, buffer.episode_starts, all_reduce)
        rewards = reward_normalizer.normalize(buffer.rewards)

    values = value_normalizer.denormalize(buffer.values)
    bootstrap = value_normalizer.denormalize(buffer.bootstrap_values)
    advantages, returns = compute_gae(
        rewards, values, bootstrap, buffer.terminated, buffer.truncated,
        config.gamma, config.gae_lambda,
    )
    old = (value_normalizer.mean, value_normalizer.std)
    value_normalizer.update(returns, all_reduce)
    policy.preserve_value_outputs(*old, value_normalizer.mean, value_normalizer.std)
    value_targets = value_normalizer.normalize(returns)

    history: dict[str, list[float]] = {}
    epochs_run, stopped, divergence = 0, False, {"approx_kl": 0.0, "clipfrac": 0.0}
    for _ in range(config.n_epochs):
        for env_ids in minibatches(buffer.n_envs, config.minibatch_envs, rank, world_size,
                                   generator):
            stats = _minibatch_step(policy, optimizer, buffer, env_ids, advantages[env_ids],
                                    value_targets[env_ids], config, all_reduce)
            for key, value in stats.items():
                history.setdefault(key, []).append(value)
        epochs_run += 1
        # How far the policy moved from the one that collected the data, on the whole batch.
        divergence = batch_divergence(policy, buffer, config.clip_coef, all_reduce)
        if config.target_kl is not None and divergence["approx_kl"] > config.target_kl:
            stopped = True
            break

    metrics = _mean_metrics(history, all_reduce)
    metrics.update(divergence, explained_variance=explained_variance(values, returns, all_reduce),
                   epochs_run=float(epochs_run), early_stopped=float(stopped))
    return metrics


def minibatches(
    n_envs: int, minibatch_envs: int, rank: int = 0, world_size: int = 1,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """One epoch's minibatches, as indices of this rank's ``n_envs`` env sequences.

    Every rank's envs (env ``k`` of rank ``r`` is global env ``r * n_envs + k``) are shuffled
    together, cut into minibatches of ``minibatch_envs`` (the last one may be smaller) and each
    minibatch is cut down to this rank's envs. Every rank draws the same permutation (an equally
    seeded ``generator``, or the global torch RNG), so N ranks take exactly the steps of one
    process holding all the envs. A rank may hold none of a minibatch's envs; it still takes
    part in the minibatch's collectives.

    Example:
        >>> g = lambda: torch.Generator().manual_seed(0)
        >>> whole = minibatches(4, 2, generator=g())
        >>> halves = [minibatches(2, 2, r, 2, generator=g()) for r in (0, 1)]
        >>> all(sorted([*(a + 0).tolist(), *(b + 2).tolist()]) == sorted(w.tolist())
        ...     for w, a, b in zip(whole, *halves))
        True
    """
    order = torch.randperm(n_envs * world_size, generator=generator)
    return [chunk[chunk // n_envs == rank] - rank * n_envs
            for chunk in order.split(minibatch_envs)]


def _mean_metrics(history: dict[str, list[float]], all_reduce: AllReduce) -> dict[str, float]:
    """Each metric's mean over the minibatches. The losses and entropies are each rank's share of
    the whole minibatch's, so the ranks' shares are summed (the clipped gradient norm is already
    the same everywhere)."""
    metrics = {key: sum(v) / len(v) for key, v in history.items()}
    shared = [key for key in metrics if key != "grad_norm"]
    total = all_reduce(torch.tensor([metrics[key] for key in shared], dtype=torch.float64))
    metrics.update(zip(shared, total.tolist(), strict=True))
    return metrics


def _evaluate(policy: FactoredRecurrentActorCritic, buffer: RolloutBuffer,
              env_ids: Tensor | slice) -> Evaluation:
    return policy.evaluate(
        buffer.obs[env_ids],
        buffer.blueprint_idx[env_ids],
        buffer.actions[env_ids],
        buffer.masks.index(env_ids),
        (buffer.hidden_h[env_ids, 0], buffer.hidden_c[env_ids, 0]),
        buffer.episode_starts[env_ids],
    )


def _minibatch_step(
    policy: FactoredRecurrentActorCritic,
    optimizer: torch.optim.Optimizer,
    buffer: RolloutBuffer,
    env_ids: Tensor,
    advantages: Tensor,
    value_targets: Tensor,
    config: PPOConfig,
    all_reduce: AllReduce = single_process,
) -> dict[str, float]:
    """Loss and one optimizer step on the env sequences ``env_ids`` (of every rank: the
    gradients are summed over the ranks before the clip and the step)."""
    actions = buffer.actions[env_ids]  # [b, T, 8]
    new = _evaluate(policy, buffer, env_ids)
    relevant = RELEVANCE[actions[..., 0]].float()  # [b, T, 8] causal mask of the stored op
    ratio = ((new.log_probs - buffer.log_probs[env_ids]) * relevant).exp()  # irrelevant: 1
    # Entropy only where the head had a choice: a forced value says nothing about exploration.
    choice = relevant * new.has_choice.float()

    pg_loss, v_loss, head_entropy = _minibatch_losses(
        new, ratio, advantages, value_targets, relevant, choice, config, all_reduce)
    coefs = torch.tensor([config.entropy_coefs[h] for h in HEADS])
    loss = pg_loss + config.vf_coef * v_loss - (coefs * head_entropy).sum()

    optimizer.zero_grad()
    loss.backward()
    sum_gradients(policy, all_reduce)
    grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
    optimizer.step()
    return {
        "policy_loss": pg_loss.item(),
        "value_loss": v_loss.item(),
        "entropy": head_entropy.sum().item(),
        "grad_norm": grad_norm.item(),
        **{f"entropy/{h}": head_entropy[i].item() for i, h in enumerate(HEADS)},
    }


def _minibatch_losses(
    new: Evaluation, ratio: Tensor, advantages: Tensor, value_targets: Tensor,
    relevant: Tensor, choice: Tensor, config: PPOConfig, all_reduce: AllReduce,
) -> tuple[Tensor, Tensor, Tensor]:
    """This rank's share of the whole minibatch's policy loss, value loss and head entropies
    (local sums over global counts, so the ranks' shares and their gradients sum to the whole
    minibatch's; one process: the means), with advantages normalised by the whole minibatch's
    mean and std. Two collectives: the counts (steps, advantage sum, steps per head with a
    choice), then the advantages' squared deviations from the global mean."""
    n_local = advantages.numel()
    counts = all_reduce(torch.cat([
        torch.tensor([n_local], dtype=torch.float64), advantages.double().sum().view(1),
        choice.double().sum((0, 1)),
    ]))
    n = float(counts[0])
    if config.norm_adv:
        mean = counts[1] / n
        var = all_reduce((advantages.double() - mean).square().sum()) / n
        advantages = ((advantages - mean) / (var.sqrt() + 1e-8)).to(ratio.dtype)
    pg_loss = clipped_surrogate_loss(ratio, advantages, relevant, config.clip_coef, steps=n)
    v_loss = 0.5 * (new.values - value_targets).square().sum() / n
    head_entropy = masked_head_means(new.entropy, choice, counts[2:])
    return pg_loss, v_loss, head_entropy


@torch.no_grad()
def sum_gradients(policy: nn.Module, all_reduce: AllReduce) -> None:
    """Replace every parameter's gradient by its sum over the ranks (one flat all-reduce, what
    DDP's bucketed reduction does for a model this small)."""
    params = list(policy.parameters())
    flat = all_reduce(torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params
    ]))
    for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.grad = part.view_as(p).clone()


@torch.no_grad()
def batch_divergence(
    policy: FactoredRecurrentActorCritic, buffer: RolloutBuffer, clip_coef: float,
    all_reduce: AllReduce = single_process,
) -> dict[str, float]:
    """Joint approximate KL and clip fraction of the current policy against the rollout policy,
    over the whole batch of every rank (measured after an update epoch, so it is the real
    movement, not the zero of a minibatch evaluated before its own step; over every rank's
    batch, so the early stop is one decision for all)."""
    new = _evaluate(policy, buffer, slice(None))
    relevant = RELEVANCE[buffer.actions[..., 0]].float()
    sums = all_reduce(divergence_sums(new.log_probs - buffer.log_probs, relevant, clip_coef))
    return {"approx_kl": float(sums[0] / sums[1]),
            "clipfrac": float(sums[2] / sums[3].clamp(min=1))}


def clipped_surrogate_loss(
    ratio: Tensor, advantages: Tensor, relevant: Tensor, clip_coef: float,
    steps: float | None = None,
) -> Tensor:
    """PPO's clipped surrogate per head, summed over the relevant heads of each step and
    averaged over steps.

    Args:
        ratio: ``[b, T, 8]`` per-head probability ratios pi_new / pi_old.
        advantages: ``[b, T]`` (shared by every head of a step).
        relevant: ``[b, T, 8]`` 1.0 where the head is causally relevant to the stored op.
        clip_coef: epsilon of the clip range ``[1 - eps, 1 + eps]``.
        steps: the number of steps to average over (None: these ``b * T``; a data-parallel
            rank passes the whole minibatch's, so its loss is its share, 0 for no steps).
    """
    adv = advantages[..., None]  # broadcast over heads
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - clip_coef, 1 + clip_coef)
    total = (torch.max(unclipped, clipped) * relevant).sum()
    return total / (advantages.numel() if steps is None else steps)


def divergence_sums(logratio: Tensor, relevant: Tensor, clip_coef: float) -> Tensor:
    """The sums behind the approximate KL and the clip fraction, summable over ranks (float64):
    ``[Σ (r - 1) - log r, steps, relevant (step, head) pairs whose ratio left the clip range,
    relevant pairs]``. The approximate KL (``sums[0] / sums[1]``) is KL(pi_old || pi_new) of the
    JOINT factored action, ``log r = Σ_relevant heads logratio`` (an average of per-head KLs
    would under-state it); the clip fraction is ``sums[2] / sums[3]``, per head."""
    joint = (logratio * relevant).sum(-1)
    outside = (((logratio * relevant).exp() - 1).abs() > clip_coef).float() * relevant
    return torch.stack([
        ((joint.exp() - 1) - joint).sum(), joint.new_tensor(joint.numel()),
        outside.sum(), relevant.sum(),
    ]).double()


def masked_head_means(values: Tensor, relevant: Tensor, counts: Tensor) -> Tensor:
    """Each head's sum of ``values`` ``[b, T, 8]`` over this rank's steps where ``relevant``,
    divided by ``counts`` ``[8]``, those steps of every rank: this rank's share of the mean
    (one process, ``counts = relevant.sum((0, 1))``: the mean) -> ``[8]``."""
    return (values * relevant).sum((0, 1)) / counts.clamp(min=1).float()
