"""Shipping a trained policy (`app.ppo.ship`): a small file that acts like the checkpoint, its
manifest entry (SHA-256, commands, cost), and what is refused."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from esper_lightning.app.config import load_config
from esper_lightning.app.ppo import ship as ship_module
from esper_lightning.app.ppo.ship import MANIFEST, main, ship_policy
from esper_lightning.app.ppo.trainer import PPOTrainer
from esper_lightning.errors import ConfigError
from esper_lightning.rl.checkpoint import load_policy_file, read_checkpoint


@pytest.fixture
def trained(cifar_dir, tmp_path):
    save = tmp_path / "run" / "ckpt.pt"
    config = load_config("smoke", overrides={
        "data_dir": str(cifar_dir), "logdir": str(tmp_path / "logs"), "progress": False,
        "episode_length": 3, "rounds": 1, "save": str(save)})
    PPOTrainer(config, command=["esper-lightning", "ppo", "--preset", "smoke"]).train()
    return save


def test_a_shipped_policy_acts_like_its_checkpoint_and_is_in_the_manifest(trained, tmp_path):
    out = tmp_path / "policies" / "smoke-1.pt"
    entry = ship_policy(trained, out)
    assert out.stat().st_size < trained.stat().st_size
    assert "optimizer" not in read_checkpoint(out) and "rng" not in read_checkpoint(out)
    original, shipped = load_policy_file(trained), load_policy_file(out)
    for key, value in original.policy.state_dict().items():
        assert torch.equal(value, shipped.policy.state_dict()[key]), key
    assert torch.equal(original.obs_rms.mean, shipped.obs_rms.mean)
    manifest = json.loads((out.parent / MANIFEST).read_text())
    assert manifest == {"smoke-1.pt": entry}
    assert entry["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert entry["commands"] == [["esper-lightning", "ppo", "--preset", "smoke"]]
    assert entry["training_cost"]["episodes"] == 2 and entry["rounds"] == 1
    assert entry["task"] == "cifar" and entry["slots"] == ["r0c1", "r0c2"]
    assert ship_policy(trained, out) == entry  # shipping the same policy again changes nothing


def test_what_shipping_refuses(trained, tmp_path, capsys):
    out = tmp_path / "policies" / "p.pt"
    ship_policy(trained, out)
    other = read_checkpoint(trained)
    other["round"] = 7
    torch.save(other, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="holds another policy already; ship to another name"):
        ship_policy(tmp_path / "other.pt", out)
    assert not out.with_name("p.pt.new").exists()
    old = {k: v for k, v in read_checkpoint(trained).items() if k != "commands"}
    torch.save(old, tmp_path / "old.pt")
    assert main([str(tmp_path / "old.pt"), "--out", str(tmp_path / "q.pt")]) == 2
    assert "records no commands (trained before it was recorded" in capsys.readouterr().err
    from_python = {**read_checkpoint(trained), "commands": []}  # PPOTrainer(config) records none
    torch.save(from_python, tmp_path / "python.pt")
    with pytest.raises(ConfigError, match=r"records no commands .*not by esper-lightning ppo"):
        ship_policy(tmp_path / "python.pt", tmp_path / "q.pt")
    with pytest.raises(ConfigError, match="is a folder; accepted: a file path such as"):
        ship_policy(trained, tmp_path / "policies")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / MANIFEST).write_text("{not json")
    with pytest.raises(ConfigError, match=r"^cannot read manifest '.*manifest\.json'"):
        ship_policy(trained, tmp_path / "broken" / "p.pt")
    (tmp_path / "listed").mkdir()  # valid JSON, not an object: refused before a file is written
    (tmp_path / "listed" / MANIFEST).write_text("[]")
    with pytest.raises(ConfigError, match=r"manifest\.json' holds a JSON list; accepted: an "):
        ship_policy(trained, tmp_path / "listed" / "p.pt")
    assert sorted(p.name for p in (tmp_path / "listed").iterdir()) == [MANIFEST]
    with pytest.raises(ConfigError, match=r"is the checkpoint itself; accepted: a new file"):
        ship_policy(trained, trained)
    assert main([str(tmp_path / "missing.pt"), "--out", str(tmp_path / "q.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "q.pt").exists()


# --- the command line: the flags it always took, in compare's style -----------------------------
@pytest.fixture
def shipped(monkeypatch) -> list[tuple]:
    """What ``main`` hands `ship_policy`, recorded instead of shipped."""
    seen: list[tuple] = []
    entry = {"bytes": 1234, "sha256": "ab" * 32, "training_cost": {"episodes": 2048.0}}
    monkeypatch.setattr(ship_module, "ship_policy", lambda *args: seen.append(args) or entry)
    return seen


@pytest.mark.parametrize("argv", [
    ["runs/grow124-s1.pt", "--out", "policies/grow124-s1.pt"],  # the tutorial's, as written
    ["--out", "policies/grow124-s1.pt", "runs/grow124-s1.pt"],
    ["runs/grow124-s1.pt", "--out=policies/grow124-s1.pt"],
])
def test_the_command_takes_the_checkpoint_and_out(shipped, argv, capsys):
    assert main(argv) == 0
    assert shipped == [("runs/grow124-s1.pt", "policies/grow124-s1.pt")]
    assert capsys.readouterr().out == (f"policies/grow124-s1.pt: 1,234 bytes, sha256 {'ab' * 32}"
                                       ", 2,048 training episodes\n")


def test_print_config_writes_what_config_reads_back(shipped, tmp_path, capsys):
    assert main(["c.pt", "--out", "p.pt", "--print_config"]) == 0
    assert shipped == []
    file = tmp_path / "ship.yaml"
    file.write_text(capsys.readouterr().out)
    assert main(["--config", str(file)]) == 0
    assert shipped == [("c.pt", "p.pt")]


def test_help_lists_the_arguments_it_listed_and_config(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: esper-lightning ship ")
    for option in ("checkpoint", "--out OUT", "--config CONFIG", "--print_config", "--version"):
        assert option in text, option


@pytest.mark.parametrize(("argv", "message"), [
    ([], "the following arguments are required: checkpoint, --out"),
    (["c.pt"], "the following arguments are required: --out"),
    (["c.pt", "d.pt", "--out", "p.pt"], "unrecognized arguments: d.pt"),
])
def test_a_bad_command_line_is_one_line_and_status_2(shipped, argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"esper-lightning ship: error: {message}\n" and shipped == []
