"""PPOTrainer end to end on a tiny CIFAR-format fixture: TensorBoard tags, checkpoints, resume."""

import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from esper_lightning.app.compare.arms import ARM_KINDS, parse_controller
from esper_lightning.app.config import ConfigError, load_config
from esper_lightning.app.ppo import checkpoint as ppo_checkpoint
from esper_lightning.app.ppo.trainer import TIMELINE_TAG, PPOTrainer
from esper_lightning.app.task import germinable_blueprints
from esper_lightning.controllers import PolicyController
from esper_lightning.core.divergence import Governor
from esper_lightning.rl.checkpoint import read_checkpoint

PPO_TAGS = {
    "charts/round", "charts/learning_rate", "charts/controller_share", "charts/episodic_return",
    "charts/final_accuracy", "charts/env_epochs_per_sec",
    "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
    "losses/clipfrac", "losses/explained_variance", "morpho/seeds_germinated",
    "morpho/seeds_fossilized", "morpho/seeds_pruned", "morpho/seed_params",
    "governor/rollbacks", "actions/wait", "actions/germinate", "actions/prune",
    "actions/fossilize", "actions/advance", "actions/set_alpha_target", "rewards/total",
    "rewards/attribution", "rewards/pbrs", "rewards/terminal",
}


def documented_tags() -> list[str]:
    """The tags of the PPO trainer's table in docs/reference/tensorboard.md, as patterns
    (``<op>``: any name)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "tensorboard.md"
            ).read_text()
    section = text.split("## The PPO trainer")[1].split("\n## ")[0]
    cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    tags = [tag for cell in cells for tag in re.findall(r"`([^`]+)`", cell)]
    return [re.sub(r"<\w+>", ".+", re.escape(tag).replace(r"\<", "<").replace(r"\>", ">"))
            for tag in tags]


def _config(cifar_dir: Path, tmp_path: Path, **overrides):
    values = {"data_dir": str(cifar_dir), "logdir": str(tmp_path / "logs"), "progress": False,
              "episode_length": 3, **overrides}
    return load_config("smoke", overrides=values)


#: The command line of `norm_stage`'s run.
STAGE_ONE = ["esper-lightning", "ppo", "--blueprints", "norm"]


@pytest.fixture(scope="module")
def norm_stage(_cifar_master: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """One round of a run that may germinate ``norm`` only (`STAGE_ONE`), trained once for the
    tests that read it: ``trainer`` (trained), ``first`` (its checkpoint), ``logs`` (its
    TensorBoard run) and ``data``. Read-only: the module fails at teardown if the checkpoint
    changed."""
    root = tmp_path_factory.mktemp("norm_stage")
    data = Path(shutil.copytree(_cifar_master, root / "cifar"))
    first = root / "first.pt"
    trainer = PPOTrainer(_config(data, root / "a", save=str(first), blueprints=["norm"],
                                 rounds=1), command=STAGE_ONE)
    trainer.train()
    before = first.read_bytes()
    yield SimpleNamespace(trainer=trainer, first=first, data=data,
                          logs=root / "a" / "logs" / "ppo" / "version_0")
    assert first.read_bytes() == before, "a test changed the norm stage's checkpoint"


@pytest.fixture(scope="module")
def ab_run(_cifar_master: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One round of an A/B run (``shaped`` and ``sparse``, one env each) saved as ``ckpt.pt``
    in ``root``, trained once for the tests that read it: ``trainer``, ``save``, ``root``."""
    root = tmp_path_factory.mktemp("ab_run")
    data = Path(shutil.copytree(_cifar_master, root / "cifar"))
    save = root / "ckpt.pt"
    trainer = PPOTrainer(_config(data, root, rounds=1, save=str(save), ab=["shaped", "sparse"]))
    trainer.train()
    return SimpleNamespace(trainer=trainer, save=save, root=root, data=data)


def test_smoke_round_logs_spec_tags_and_writes_a_checkpoint(cifar_dir, tmp_path):
    save = tmp_path / "ckpt.pt"
    trainer = PPOTrainer(_config(cifar_dir, tmp_path, save=str(save)))
    history = trainer.train()
    assert len(history) == 2 and trainer.round == 2
    assert all(len(s.returns) >= 2 for s in history)  # at least one episode per env
    events = EventAccumulator(str(tmp_path / "logs" / "ppo" / "version_0"),
                              size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags >= PPO_TAGS, PPO_TAGS - tags
    assert "hp_metric" not in tags  # Lightning's placeholder: no single number ranks a run
    # CleanRL's x axis: env steps (decisions) so far, 2 envs x 2 decisions a round; the round
    # and the step size are scalars of their own.
    for tag in tags:
        assert [e.step for e in events.Scalars(tag)] == [4, 8], tag
    assert [e.value for e in events.Scalars("charts/round")] == [1.0, 2.0]
    lr = [e.value for e in events.Scalars("charts/learning_rate")]
    assert lr == pytest.approx([trainer.config.learning_rate] * 2)
    documented = documented_tags()
    assert all(any(re.fullmatch(d, tag) for d in documented) for tag in tags), \
        [t for t in tags if not any(re.fullmatch(d, t) for d in documented)]
    fractions = sum(events.Scalars(f"actions/{op}")[0].value for op in
                    ("wait", "germinate", "prune", "fossilize", "advance", "set_alpha_target"))
    assert fractions == pytest.approx(1.0)
    # Which blueprints were germinated: every germinable one has a tag each round (0 where
    # none was), and they add up to the round's germinations.
    by_blueprint = {f"germinated/{b}" for b in germinable_blueprints(trainer.config)}
    assert {t for t in tags if t.startswith("germinated/")} == by_blueprint
    totals = [sum(events.Scalars(tag)[r].value for tag in by_blueprint) for r in range(2)]
    assert totals == [e.value for e in events.Scalars("morpho/seeds_germinated")]
    assert sum(totals) > 0  # the untrained policy germinates: the check has something to add
    hparams = (tmp_path / "logs" / "ppo" / "version_0" / "hparams.yaml").read_text()
    assert "episode_length: 3" in hparams
    state = read_checkpoint(save)  # weights_only=True
    assert state["round"] == 2 and state["config"]["episode_length"] == 3
    assert not (tmp_path / "ckpt.pt.tmp").exists()


def test_a_run_with_a_subset_of_blueprints_germinates_only_those_and_saves_them(norm_stage,
                                                                               cifar_dir,
                                                                               tmp_path):
    trainer, save = norm_stage.trainer, norm_stage.first
    for env in trainer.pool.envs:
        assert env.engine.mask_context.blueprints == ("norm",)
        assert {entry.blueprint for entry in env.engine.timeline} <= {None, "norm"}
    assert read_checkpoint(save)["allowed_blueprints"] == ["norm"]
    events = EventAccumulator(str(norm_stage.logs))
    events.Reload()
    assert [t for t in events.Tags()["scalars"] if t.startswith("germinated/")] == [
        "germinated/norm"]
    assert events.Scalars("germinated/norm")[0].value > 0  # it germinated: the checks bite
    assert PolicyController(save).bundle.allowed_blueprints == ("norm",)
    with pytest.raises(ConfigError, match="unknown blueprint 'block_identity' for the slots of "
                       "task 'cifar'; accepted: norm, "):
        PPOTrainer(_config(cifar_dir, tmp_path, blueprints=["block_identity"]))


def _policy(trainer: PPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.learners[0].policy.state_dict().items()}


def test_a_run_starts_from_another_runs_policy_with_more_blueprints(norm_stage, cifar_dir,
                                                                    tmp_path):
    """A curriculum: a policy trained with one blueprint starts a run that allows them all, its
    weights and observation normaliser as saved and everything else fresh; a checkpoint of
    another policy width is refused in one line."""
    first, stage_one = norm_stage.first, STAGE_ONE
    saved = read_checkpoint(first)
    spec = parse_controller(f"policy:{first}")  # what compare's cost table reads of it
    assert ARM_KINDS["policy"].cost(spec, None) == {"made_by": "PPO training", "rounds": 1,
                                                    "episodes": 2, **{k: saved["training_cost"][k]
                                                    for k in ("train_flops", "wall_seconds")}}
    started = PPOTrainer(_config(cifar_dir, tmp_path / "b", init_policy=str(first), rounds=1),
                         command=["esper-lightning", "ppo", "--init_policy", str(first)])
    learner = started.learners[0]
    # A curriculum costs all its stages: the first stage's cost and command come along.
    assert learner.cost == saved["training_cost"] and saved["commands"] == [stage_one]
    assert learner.commands == [stage_one, ["esper-lightning", "ppo", "--init_policy",
                                            str(first)]]
    assert all(torch.equal(v, saved["policy"][k]) for k, v in _policy(started).items())
    assert torch.equal(learner.obs_rms.mean, saved["obs_rms"]["mean"])
    assert started.round == 0 and not learner.optimizer.state  # the optimizer starts afresh
    started.train()
    allowed = started.pool.envs[0].engine.mask_context.blueprints
    assert "norm" in allowed and len(allowed) > 1  # every blueprint of the slots, not one
    # An action prior: the blueprints the first stage could not choose start at 10 % together.
    # Why: the first stage's blueprint head is still at its initialisation (one allowed
    # blueprint: its log-probability is 0 whatever the logits), while the op head learned.
    untrained = _policy(PPOTrainer(_config(cifar_dir, tmp_path / "e", blueprints=["norm"])))
    trained = saved["policy"]
    assert all(torch.equal(v, trained[k]) for k, v in untrained.items()
               if k.startswith("heads.blueprint."))
    assert not all(torch.equal(v, trained[k]) for k, v in untrained.items()
                   if k.startswith("heads.op."))
    prior = PPOTrainer(_config(cifar_dir, tmp_path / "f", init_policy=str(first),
                               new_blueprint_share=0.1)).learners[0].policy
    allowed = prior.config.blueprints
    new = [b for b in started.pool.envs[0].engine.mask_context.blueprints if b != "norm"]
    bias = prior.heads["blueprint"][-1].bias
    assert float(bias[allowed.index("norm")].detach().exp()) == pytest.approx(0.9)
    assert [float(bias[allowed.index(b)].detach().exp()) for b in new] == pytest.approx(
        [0.1 / len(new)] * len(new))
    with pytest.raises(ConfigError, match=r"new_blueprint_share: init_policy .* was trained "
                                          r"with blueprints \['norm'\] and this run allows "
                                          r"\['norm'\], so no blueprint is new to it"):
        PPOTrainer(_config(cifar_dir, tmp_path / "g", init_policy=str(first), blueprints=["norm"],
                           new_blueprint_share=0.1))
    with pytest.raises(ConfigError, match="new_blueprint_share sets the prior of a policy "
                                          "started from init_policy"):
        _config(cifar_dir, tmp_path / "h", new_blueprint_share=0.1)
    fresh = PPOTrainer(_config(cifar_dir, tmp_path / "c", rounds=1))
    assert not all(torch.equal(v, saved["policy"][k]) for k, v in _policy(fresh).items())
    with pytest.raises(ConfigError, match=re.escape(
            f"init_policy '{first}' was trained with policy_hidden=32 (this run: 16); a run "
            "starts only from a policy of its own task, slots, policy_hidden, heads")):
        PPOTrainer(_config(cifar_dir, tmp_path / "d", init_policy=str(first), policy_hidden=16))


def test_a_shipped_policy_starts_a_curriculum_as_its_checkpoint_does(norm_stage, cifar_dir,
                                                                     tmp_path):
    """``esper-lightning ship`` keeps what ``init_policy`` reads (weights, observation
    normaliser, cost, commands), so a curriculum starts from the committed file as from the
    training checkpoint (which lives outside the repository and may be gone)."""
    from esper_lightning.app.ppo.ship import ship_policy

    first, stage_one = norm_stage.first, STAGE_ONE
    shipped = tmp_path / "policies" / "first.pt"
    shipped.parent.mkdir()
    ship_policy(first, shipped)
    starts = [PPOTrainer(_config(cifar_dir, tmp_path / name, init_policy=str(path),
                                 new_blueprint_share=0.1),
                         command=["esper-lightning", "ppo", "--init_policy", str(path)])
              for name, path in (("b", first), ("c", shipped))]
    from_checkpoint, from_shipped = (start.learners[0] for start in starts)
    assert _policy(starts[0]).keys() == _policy(starts[1]).keys()
    assert all(torch.equal(v, _policy(starts[1])[k]) for k, v in _policy(starts[0]).items())
    assert torch.equal(from_checkpoint.obs_rms.mean, from_shipped.obs_rms.mean)
    assert torch.equal(from_checkpoint.obs_rms.var, from_shipped.obs_rms.var)
    assert from_shipped.cost == from_checkpoint.cost == read_checkpoint(first)["training_cost"]
    assert from_shipped.commands[0] == stage_one


def test_resume_continues_exactly(norm_stage, cifar_dir, tmp_path):
    # The first round is `norm_stage`'s (the same data, config and round-0 rng seeds), saved
    # after it; a straight run of two rounds against it resumed for the second.
    straight = PPOTrainer(_config(cifar_dir, tmp_path / "a", rounds=2, blueprints=["norm"]))
    straight.train()
    first = read_checkpoint(norm_stage.first)
    resumed = PPOTrainer(_config(cifar_dir, tmp_path / "c", rounds=2, blueprints=["norm"],
                                 resume=str(norm_stage.first)), command=["ppo", "--resume"])
    assert resumed.round == 1
    resumed.train()
    a, b = _policy(straight), _policy(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(straight.learners[0].obs_rms.mean, resumed.learners[0].obs_rms.mean)
    # And the resumed run really moved the policy past the checkpoint.
    assert not all(torch.equal(a[k], first["policy"][k]) for k in a)
    # The training cost counts every round, those before the resume too.
    cost = resumed.learners[0].cost
    assert (cost["rounds"], cost["episodes"]) == (2, 2 * 2)  # smoke: 2 envs
    assert cost["train_flops"] > 0 and cost["train_flops"] == pytest.approx(
        sum(sum(s.train_flops) for s in straight.learners[0].history))
    assert cost["wall_seconds"] > first["training_cost"]["wall_seconds"] > 0
    # So does the list of the command lines that trained it, first to last.
    assert first["commands"] == [STAGE_ONE]
    assert resumed.learners[0].commands == [STAGE_ONE, ["ppo", "--resume"]]


def test_incompatible_checkpoint_is_refused_before_anything_runs(norm_stage, cifar_dir,
                                                                  tmp_path):
    save = norm_stage.first
    before = save.read_bytes()
    with pytest.raises(ConfigError, match=r"incompatible config: slots=\['r0c1', 'r0c2'\]"):
        PPOTrainer(_config(cifar_dir, tmp_path, slots=["r0c0"], blueprints=["norm"],
                           resume=str(save), save=str(save)))
    assert save.read_bytes() == before


def test_a_resume_trains_with_the_learning_rate_it_is_given(norm_stage, cifar_dir, tmp_path):
    """The optimizer state loaded from the checkpoint carried the saved lr, so a resume with
    a new --learning_rate logged the change and went on with the old one."""
    saved = read_checkpoint(norm_stage.first)["optimizer"]["param_groups"][0]["lr"]
    resumed = PPOTrainer(_config(cifar_dir, tmp_path, rounds=2, blueprints=["norm"],
                                 resume=str(norm_stage.first), learning_rate=saved / 10))
    groups = resumed.learners[0].optimizer.param_groups
    assert [g["lr"] for g in groups] == [pytest.approx(saved / 10)] * len(groups)


def test_a_resume_with_another_gamma_is_refused_before_anything_loads(norm_stage, cifar_dir,
                                                                      tmp_path, monkeypatch):
    """The reward normaliser refused the saved return statistics with a bare ValueError
    ("reward normaliser gamma 0.995 != 0.99") after the policy weights were loaded."""
    saved = read_checkpoint(norm_stage.first)["config"]["gamma"]
    loaded = []
    monkeypatch.setattr(ppo_checkpoint, "load_policy_weights", lambda *a: loaded.append(a))
    with pytest.raises(ConfigError) as err:
        PPOTrainer(_config(cifar_dir, tmp_path, rounds=2, blueprints=["norm"],
                           resume=str(norm_stage.first), gamma=0.99))
    assert str(err.value) == (f"checkpoint '{norm_stage.first}' comes from an incompatible "
                              f"config: gamma={saved!r} (now 0.99)")
    assert saved != 0.99 and not loaded


def test_a_resume_that_would_train_nothing_or_has_no_training_state_is_refused(
        norm_stage, cifar_dir, tmp_path):
    """Resuming a run at its last round logged an empty TensorBoard file and exited 0 with
    nothing trained; resuming a shipped policy (no optimizer) raised KeyError."""
    with pytest.raises(ConfigError) as err:
        PPOTrainer(_config(cifar_dir, tmp_path / "a", rounds=1, blueprints=["norm"],
                           resume=str(norm_stage.first)))
    assert str(err.value) == (f"checkpoint '{norm_stage.first}' has trained 1 rounds already; "
                              "pass --rounds N with N > 1 to continue it (got 1)")
    shipped = {k: v for k, v in read_checkpoint(norm_stage.first).items() if k != "optimizer"}
    torch.save(shipped, tmp_path / "shipped.pt")
    with pytest.raises(ConfigError, match=r"holds a policy without its training state \(a "
                                          r"shipped policy\); start a new run from it with "
                                          r"--init_policy"):
        PPOTrainer(_config(cifar_dir, tmp_path / "b", rounds=2, blueprints=["norm"],
                           resume=str(tmp_path / "shipped.pt")))
    assert not (tmp_path / "a" / "logs").exists()  # refused before the logger wrote a file


def test_unreadable_checkpoint(tmp_path):
    bogus = tmp_path / "x.pt"
    bogus.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot read checkpoint"):
        read_checkpoint(bogus)
    with pytest.raises(ConfigError, match="does not exist"):
        read_checkpoint(tmp_path / "missing.pt")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_cuda_options_on_a_cpu_machine_are_config_errors(cifar_dir, tmp_path):
    with pytest.raises(ConfigError, match="CUDA is not available"):
        PPOTrainer(_config(cifar_dir, tmp_path, device="cuda"))
    with pytest.raises(ConfigError, match="'16-mixed' needs CUDA devices"):
        PPOTrainer(_config(cifar_dir, tmp_path, precision="16-mixed"))


def test_resume_continues_the_same_tensorboard_run_with_a_line_and_a_timeline_per_round(
        cifar_dir, tmp_path, caplog):
    save = tmp_path / "ckpt.pt"
    with caplog.at_level(logging.INFO, logger="esper_lightning"):
        PPOTrainer(_config(cifar_dir, tmp_path, rounds=1, save=str(save))).train()
        resumed = PPOTrainer(_config(cifar_dir, tmp_path, rounds=2, resume=str(save)))
        resumed.train()
    assert read_checkpoint(save)["log_version"] == 0
    assert sorted(p.name for p in (tmp_path / "logs" / "ppo").iterdir()) == ["version_0"]
    events = EventAccumulator(str(tmp_path / "logs" / "ppo" / "version_0"),
                              size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("charts/final_accuracy")] == [4, 8]
    assert [e.value for e in events.Scalars("charts/round")] == [1.0, 2.0]
    assert [e.step for e in events.Images(TIMELINE_TAG)] == [4, 8]
    rounds = [r.getMessage() for r in caplog.records if r.name == "esper_lightning.app.ppo.trainer"]
    assert [m.split(":")[0] for m in rounds] == ["round 1/1", "round 2/2"]
    assert re.fullmatch(r"round 2/2: final accuracy \d+\.\d\d%, return -?\d+\.\d{3}, "
                        r"ops (\w+=\d+ ?)+, \d+\.\d s", rounds[1]), rounds[1]
    resumed = [r.getMessage() for r in caplog.records
               if r.name == "esper_lightning.app.ppo.checkpoint"]
    assert resumed == [f"resuming '{save}' after round 1 with these changes: rounds 1 -> 2, "
                       f"save '{save}' -> None"]
    # hparams.yaml holds the settings the run goes on with, as --config would read them back:
    # it kept the first process's `rounds: 1`.
    hparams = yaml.safe_load((tmp_path / "logs" / "ppo" / "version_0" / "hparams.yaml").read_text())
    assert hparams["rounds"] == 2 and hparams["resume"] == str(save) and hparams["save"] is None


def test_ab_trains_one_policy_per_reward_mode_on_the_same_episodes(ab_run, cifar_dir,
                                                                    tmp_path):
    fresh = PPOTrainer(_config(cifar_dir, tmp_path, rounds=1, ab=["shaped", "sparse"]))
    assert [learner.name for learner in fresh.learners] == ["shaped", "sparse"]
    assert [learner.envs for learner in fresh.learners] == [[0], [1]]
    fresh._reset_pool(0, fresh._begin_round(0))
    first, second = (env.host.state_dict() for env in fresh.pool.envs)
    assert all(torch.equal(first[k], second[k]) for k in first  # the same episode seed
               if isinstance(first[k], torch.Tensor))
    trainer, root = ab_run.trainer, ab_run.root  # the same run, trained
    for mode in ("shaped", "sparse"):
        state = read_checkpoint(root / f"ckpt.{mode}.pt")
        assert state["config"]["reward"] == mode and state["config"]["envs"] == 1
        assert state["config"]["ab"] == []
        assert (root / "logs" / f"ppo-{mode}" / "version_0").is_dir()
    a, b = (learner.policy.state_dict() for learner in trainer.learners)
    assert not all(torch.equal(a[k], b[k]) for k in a)  # two policies, not one


def test_ab_needs_envs_that_split_evenly(cifar_dir, tmp_path):
    with pytest.raises(ConfigError, match="does not split evenly"):
        _config(cifar_dir, tmp_path, envs=3, ab=["shaped", "sparse"])
    with pytest.raises(ConfigError, match="two or more different reward modes"):
        _config(cifar_dir, tmp_path, ab=["shaped"])


def test_lm_smoke_preset_learns_on_a_text_file(text_file, tmp_path):
    save = tmp_path / "lm.pt"
    # Episodes of 3 epochs (the preset's 4 less one: what is read here is the task, not the
    # length): two rounds still reset every env for a second episode.
    config = load_config("lm-smoke", overrides={
        "data_dir": str(text_file), "logdir": str(tmp_path / "logs"), "progress": False,
        "save": str(save), "episode_length": 3})
    trainer = PPOTrainer(config)
    history = trainer.train()
    assert len(history) == 2 and all(len(s.returns) >= 2 for s in history)
    assert all(0.0 <= a <= 100.0 for s in history for a in s.final_accuracies)
    env = trainer.pool.envs[0]
    assert type(env.host).__name__ == "GPTHost" and env.governor.config.num_classes == 256
    assert env.val_batches[0][0].shape[1] == 32  # lm-smoke's block size
    state = read_checkpoint(save)
    assert state["config"]["task"] == "lm" and state["config"]["host_preset"] == "tiny"


def force_one_rollback(monkeypatch, at_check: int = 2) -> None:
    """Every governor asks for a rollback at its ``at_check``-th validation (the first is the
    epoch before the first decision), once."""
    real, checks = Governor.check_validation, {}

    def check(self, val_loss, val_accuracy=None, num_classes=None):
        checks[id(self)] = checks.get(id(self), 0) + 1
        if checks[id(self)] == at_check:
            return "governor_forced"
        return real(self, val_loss, val_accuracy, num_classes)

    monkeypatch.setattr(Governor, "check_validation", check)


def test_a_rollback_costs_its_penalty_and_the_episode_goes_on(cifar_dir, tmp_path,
                                                               monkeypatch):
    """The same rule as `compare`: the env restores, the penalty is charged at that step, the
    episode plays to its end and its outcome is paid there."""
    force_one_rollback(monkeypatch)
    trainer = PPOTrainer(_config(cifar_dir, tmp_path, rounds=1, episode_length=4))
    resets = []
    real_reset = trainer.pool.reset
    trainer.pool.reset = lambda *a, **k: resets.append(a) or real_reset(*a, **k)
    (stats,) = trainer.run_round(0)
    assert len(resets) == 1  # no env started a new episode
    assert stats.rollbacks == 2 and stats.steps == 2 * 3
    assert len(stats.returns) == len(stats.final_accuracies) == 2
    assert stats.reward_sums["rollback"] == pytest.approx(-2 * 10.0)
    assert stats.reward_sums["terminal"] != 0.0  # both outcomes paid at the end


def test_a_fresh_run_does_not_replace_a_checkpoint_it_does_not_resume(norm_stage, cifar_dir,
                                                                       tmp_path):
    save, other = tmp_path / "ckpt.pt", tmp_path / "other.pt"
    save.write_bytes(norm_stage.first.read_bytes())  # a one-round run's checkpoint
    other.write_bytes(save.read_bytes())
    before = save.read_bytes()
    norm = {"blueprints": ["norm"]}  # the saved run's, so that resuming it is compatible
    with pytest.raises(ConfigError, match=rf"^save '{save}' already exists; pass --resume "):
        PPOTrainer(_config(cifar_dir, tmp_path, rounds=1, save=str(save), **norm))
    with pytest.raises(ConfigError, match=rf"^save '{save}' already exists and is not the "
                                          rf"checkpoint this run resumes \('{other}'\)"):
        PPOTrainer(_config(cifar_dir, tmp_path, rounds=2, save=str(save), resume=str(other),
                           **norm))
    assert save.read_bytes() == before
    PPOTrainer(_config(cifar_dir, tmp_path, rounds=2, save=str(save), resume=str(save), **norm))
    PPOTrainer(_config(cifar_dir, tmp_path, rounds=1, save=str(save), overwrite=True))
    ab = {"ab": ["shaped", "sparse"], "rounds": 1, "save": str(tmp_path / "ab.pt")}
    (tmp_path / "ab.sparse.pt").write_bytes(before)
    with pytest.raises(ConfigError, match=r"^save '.*ab.sparse.pt' already exists; pass "
                                          r"--resume .*ab.pt to continue"):
        PPOTrainer(_config(cifar_dir, tmp_path, **ab))


def test_a_run_that_fails_before_its_first_round_ends_leaves_no_log_folder(cifar_dir, tmp_path,
                                                                           monkeypatch):
    trainer = PPOTrainer(_config(cifar_dir, tmp_path, rounds=1))

    def fail(*args, **kwargs):
        raise KeyboardInterrupt  # the user stops the first round

    monkeypatch.setattr(trainer.pool, "step", fail)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert not (tmp_path / "logs").exists()


def test_resume_alone_continues_an_ab_run_from_its_stem(ab_run):
    """An A/B run saves ``ckpt.<mode>.pt``: ``--resume ckpt.pt`` alone finds them and takes the
    whole run's configuration (not one policy's share of it)."""
    from esper_lightning.app.cli import parse_config

    save = ab_run.save
    config = parse_config("ppo", ["--resume", str(save), "--rounds", "2"])
    assert (config.ab, config.envs, config.episode_length) == (("shaped", "sparse"), 2, 3)
    trainer = PPOTrainer(config)
    assert trainer.round == 1 and [len(learner.envs) for learner in trainer.learners] == [1, 1]
