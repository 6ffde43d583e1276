"""What a user reads on the terminal: event lines that say which env, episode and controller they
come from, and log lines that never land on the progress bar's line."""

import logging
import re

import pytest
import torch
from torch import nn

from esper_lightning.app import cli
from esper_lightning.app.compare.runner import Comparison
from esper_lightning.app.config import CompareConfig, load_config
from esper_lightning.app.logs import label_engine
from esper_lightning.app.ppo.trainer import PPOTrainer
from esper_lightning.controllers import ScriptedController
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.engine import MorphogenesisEngine

EVENT = r"epoch \d+: r0c\d germinated conv_light"


def _germinate_every_epoch() -> ScriptedController:
    action = Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light")
    return ScriptedController({epoch: action for epoch in range(4)})


def _engine_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "esper_lightning.core.engine"]


def test_a_labelled_engine_names_its_controller_and_where_each_line_comes_from(caplog):
    torch.manual_seed(0)
    model = nn.Module()
    model.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
    engine = MorphogenesisEngine(model, slots=["net.1"])
    model.net(torch.zeros(1, 3, 8, 8))
    label_engine(engine, "random", episode=4, env=1)
    with caplog.at_level(logging.INFO, logger="esper_lightning"):
        engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="norm"), "a coin flip")
    assert _engine_lines(caplog) == [
        "[episode 4 env 1] epoch 0: net.1 germinated norm (random: a coin flip)"]
    assert engine.events[0].reason == "random: a coin flip"  # the controller, not "policy"


def test_ppo_labels_every_env_with_its_round_env_and_policy(cifar_dir, tmp_path):
    trainer = PPOTrainer(load_config("smoke", overrides={
        "data_dir": str(cifar_dir), "logdir": str(tmp_path), "progress": False,
        "episode_length": 3, "envs": 2, "ab": ["shaped", "sparse"]}))
    trainer._reset_pool(2, trainer._begin_round(2))
    labels = [(env.engine.controller_name, env.engine.log.extra["where"])
              for env in trainer.pool.envs]
    assert labels == [("ppo-shaped", "round 3 env 0"), ("ppo-sparse", "round 3 env 0")]


def test_compare_event_lines_name_the_controller_episode_and_env(cifar_dir, tmp_path, caplog):
    config = CompareConfig(
        data_dir=str(cifar_dir), out=str(tmp_path / "out"), episode_length=3, batch_size=16,
        slots=("r0c1", "r0c2"), min_training_epochs=1, envs=2, seeds=1, progress=False,
        controllers=("static", "mine"))
    with caplog.at_level(logging.INFO, logger="esper_lightning"):
        Comparison(config, custom={"mine": lambda plan: _germinate_every_epoch()}).run()
    lines = _engine_lines(caplog)
    assert lines and all(re.fullmatch(rf"\[episode 0 env \d\] {EVENT} \(mine\)", line)
                         for line in lines), lines


@pytest.fixture
def own_log_handler():
    """The handler `cli.main` attaches to the ``esper_lightning`` logger, taken off afterwards."""
    logger = logging.getLogger("esper_lightning")
    handlers, level = list(logger.handlers), logger.level
    logger.handlers.clear()
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_log_lines_start_on_their_own_line_above_the_progress_bar(cifar_dir, tmp_path, capsys,
                                                                  own_log_handler):
    status = cli.main(["ppo", "--preset", "smoke", "--data_dir", str(cifar_dir), "--logdir",
                       str(tmp_path), "--episode_length", "3", "--rounds", "1", "--progress"])
    err = capsys.readouterr().err
    assert status == 0 and "rounds: 100%" in err  # the bar was drawn
    # Every log line (events, then the round's) starts where the bar was cleared or a line
    # ended, never right after the bar's text.
    before = re.findall(r"(.?)\d\d:\d\d:\d\d (?:\[round|round 1/1: )", err, flags=re.DOTALL)
    assert len(before) >= 1 and set(before) <= {"\r", "\n"}, before
