"""DD-PPO: ``esper-lightning ppo`` over processes (CPU, gloo, Fabric's ``ddp_fork`` launcher: the
workers inherit the imported modules, so a launch takes seconds) against one process with every
env; resuming on another number of processes."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import local_rendezvous

from esper_lightning.app.config import ConfigError, load_config
from esper_lightning.app.ppo.distributed import launch_ppo
from esper_lightning.app.ppo.metrics import RoundStats, merge_stats
from esper_lightning.app.ppo.ranks import Ranks
from esper_lightning.app.ppo.trainer import PPOTrainer
from esper_lightning.data import write_cifar10_fixture
from esper_lightning.rl.checkpoint import read_checkpoint

#: Two processes against one: the same rollouts, sums over the batch taken in another order and
#: one all-reduce of the gradients (float32 rounding only; measured ~1e-7).
ATOL = 1e-5


def _config(cifar_dir: Path, tmp_path: Path, **overrides):
    """4 envs in minibatches of 2: a global minibatch may take both envs of one rank."""
    values = {"data_dir": str(cifar_dir), "logdir": str(tmp_path / "logs"), "progress": False,
              "episode_length": 3, "envs": 4, "minibatch_envs": 2, "rounds": 2, **overrides}
    return load_config("smoke", overrides=values)


@contextlib.contextmanager
def _local_rendezvous():
    with local_rendezvous():
        yield
    assert not torch.distributed.is_initialized()  # the workers held the process group


def _two_ranks(config):
    with _local_rendezvous():
        return launch_ppo(config.replace(strategy="ddp_fork", devices=["2"]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> SimpleNamespace:
    base = tmp_path_factory.mktemp("ddppo")
    cifar = write_cifar10_fixture(base / "cifar", n_train=80, n_test=40, rng_seed=0)
    path = {name: str(base / f"{name}.pt") for name in ("one", "two", "first", "one_two")}
    config = _config(cifar, base)
    # One process: round 1 saved as "first", round 2 resumed from it (resuming on one process
    # continues exactly: test_app_ppo_trainer's test_resume_continues_exactly), so round 1 is
    # trained once for both the run of two rounds and the resume on two processes.
    first = PPOTrainer(config.replace(save=path["first"], rounds=1,
                                      logdir=str(base / "first"))).train()
    one = first + PPOTrainer(config.replace(save=path["one"], resume=path["first"])).train()
    two = _two_ranks(config.replace(save=path["two"], logdir=str(base / "two")))
    _two_ranks(config.replace(save=path["one_two"], logdir=str(base / "one_two"),
                              resume=path["first"]))
    return SimpleNamespace(history={"one": one, "two": two}, base=base,
                           saved={k: read_checkpoint(v) for k, v in path.items()})


def _max_difference(a: dict, b: dict) -> float:
    return max(float((b["policy"][k] - v).abs().max()) for k, v in a["policy"].items())


def _assert_same_policy(a: dict, b: dict) -> None:
    for key, value in a["policy"].items():
        torch.testing.assert_close(b["policy"][key], value, atol=ATOL, rtol=0, msg=key)
    for key in ("mean", "var"):
        torch.testing.assert_close(b["obs_rms"][key], a["obs_rms"][key], rtol=1e-9, atol=1e-9)
    assert b["obs_rms"]["count"] == a["obs_rms"]["count"]  # every rank's observations
    assert b["value_normalizer"]["count"] == a["value_normalizer"]["count"]


def test_two_ranks_of_two_envs_learn_the_policy_of_one_rank_of_four(runs):
    """Two rounds with minibatches of 2 of the 4 envs: the ranks draw one process's partition
    (a rank-local one differed by 2.1e-3 after 2 rounds)."""
    one, two = runs.saved["one"], runs.saved["two"]
    assert one["round"] == two["round"] == 2
    assert _max_difference(runs.saved["first"], one) > 100 * ATOL  # a round moves it further
    _assert_same_policy(one, two)
    for a, b in zip(runs.history["one"], runs.history["two"], strict=True):
        assert b.steps == a.steps == 4 * 2  # rank 0 reports every rank's envs
        assert sorted(b.final_accuracies) == pytest.approx(sorted(a.final_accuracies), abs=1e-9)
        assert b.ppo["approx_kl"] == pytest.approx(a.ppo["approx_kl"], rel=1e-3, abs=1e-7)
        assert b.ppo["epochs_run"] == a.ppo["epochs_run"]
    assert (runs.base / "two" / "ppo" / "version_0").is_dir()  # rank 0 logged, once
    print(f"max |2 ranks x 2 envs - 1 x 4| after 2 rounds: {_max_difference(one, two):.2e}")


def test_a_checkpoint_resumes_on_another_number_of_ranks(runs):
    one, one_two = runs.saved["one"], runs.saved["one_two"]
    assert one_two["round"] == 2
    _assert_same_policy(one, one_two)  # round 1 on one process, round 2 on two


def test_ddp_options_are_checked_in_one_line(cifar_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"^envs=3 does not split evenly over 2 processes"):
        _config(cifar_dir, tmp_path, strategy="ddp", devices=["2"], envs=3)
    # A minibatch need not split evenly over the processes: it is drawn from every rank's envs.
    assert _config(cifar_dir, tmp_path, strategy="ddp", devices=["2"], minibatch_envs=1)
    for minibatch in (3, 8):  # neither divides the 4 envs of both processes
        with pytest.raises(ConfigError, match=rf"^minibatch_envs={minibatch} does not divide "
                                              rf"envs=4; accepted: 1, 2, 4$"):
            _config(cifar_dir, tmp_path, strategy="ddp", devices=["2"], minibatch_envs=minibatch)
    with pytest.raises(ConfigError, match=r"^ab=\['shaped', 'sparse'\] cannot be combined with "
                                          r"strategy ddp"):
        _config(cifar_dir, tmp_path, strategy="ddp", devices=["2"], ab=["shaped", "sparse"])
    with pytest.raises(ConfigError, match=r"devices=\['2'\] is a process count, which needs "
                                          r"--strategy ddp"):
        _config(cifar_dir, tmp_path, devices=["2"])
    with pytest.raises(ConfigError, match=r"devices is the number of processes per node"):
        _config(cifar_dir, tmp_path, strategy="ddp", devices=["cpu"])
    with pytest.raises(ConfigError, match=r"num_nodes=2 needs strategy ddp"):
        _config(cifar_dir, tmp_path, strategy="ddp_spawn", num_nodes=2)
    config = _config(cifar_dir, tmp_path, strategy="ddp", devices=["4"], num_nodes=2, envs=8,
                     minibatch_envs=8)
    assert config.world_size == 8
    with pytest.raises(ConfigError, match=r"^1 processes run a config for 8"):
        PPOTrainer(config, Ranks())


def test_round_stats_of_every_rank_merge_into_one_runs():
    a = RoundStats(returns=[1.0], steps=4, env_seconds=2.0, rollbacks=1, ppo={"approx_kl": 0.1})
    a.reward_sums["pbrs"] = -1.0
    b = RoundStats(returns=[3.0], steps=4, env_seconds=3.0, ppo={"approx_kl": 0.1})
    b.reward_sums["pbrs"] = -2.0
    a.germinated.update(["lora", "mlp"])
    b.germinated.update(["lora"])
    merged = merge_stats([a, b])
    assert merged.germinated == {"lora": 2, "mlp": 1}
    assert merged.returns == [1.0, 3.0] and merged.steps == 8 and merged.rollbacks == 1
    assert merged.env_seconds == 3.0  # ranks run side by side: the slowest rank's time
    assert merged.reward_sums["pbrs"] == -3.0 and merged.ppo == {"approx_kl": 0.1}


@pytest.mark.slow
def test_three_processes_started_by_the_command_line_match_one(cifar_dir, tmp_path):
    """The real ``ddp`` path: Fabric re-runs the command for ranks 1 and 2 (slow: three fresh
    interpreters)."""
    root = Path(__file__).resolve().parents[1]
    config = _config(cifar_dir, tmp_path, envs=3, minibatch_envs=3, rounds=1)
    PPOTrainer(config.replace(save=str(tmp_path / "one.pt"))).train()
    with _local_rendezvous():
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "esper_lightning.app.cli", "ppo", "--preset", "smoke",
             "--data_dir", str(cifar_dir), "--logdir", str(tmp_path / "three"),
             "--episode_length", "3", "--envs", "3", "--minibatch_envs", "3", "--rounds", "1",
             "--no-progress", "--strategy", "ddp", "--devices", "3",
             "--save", str(tmp_path / "three.pt")],
            env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("done: 1 round,") == 1  # rank 0 reports
    three = read_checkpoint(tmp_path / "three.pt")
    _assert_same_policy(read_checkpoint(tmp_path / "one.pt"), three)
