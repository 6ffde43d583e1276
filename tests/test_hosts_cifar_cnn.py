import lightning as L
import pytest
import torch

from esper_lightning.core.lifecycle import SeedStage
from esper_lightning.core.slots import find_slots
from esper_lightning.data import CIFAR10DataModule
from esper_lightning.hosts import CifarCNNHost


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_preset_sizes_and_slot_widths():
    assert _n_params(CifarCNNHost("baseline")) == 6418
    assert _n_params(CifarCNNHost("impaired")) == 77
    assert 95_000 < _n_params(CifarCNNHost("scale")) < 105_000
    host = CifarCNNHost("baseline")
    assert tuple(host.slots) == ("r0c0", "r0c1", "r0c2", "r1c0", "r1c1", "r1c2")
    assert {sid: s.channels for sid, s in find_slots(host).items()} == {
        "r0c0": 8, "r0c1": 16, "r0c2": 32, "r1c0": 8, "r1c1": 16, "r1c2": 32,
    }


def test_slot_selection_keeps_canonical_order():
    host = CifarCNNHost("baseline", slots=["r1c0", "r0c2"])
    assert tuple(host.slots) == ("r0c2", "r1c0")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"preset": "huge"}, "unknown host preset 'huge'; accepted: baseline, impaired, scale"),
        ({"slots": ["r0c9"]}, "unknown slot id(s) 'r0c9' for preset 'baseline'; accepted: r0c0"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CifarCNNHost(**kwargs)


def test_forward_with_a_blending_seed_changes_output_and_excludes_seed_from_host_params():
    host = CifarCNNHost("baseline", slots=["r0c1"])
    x = torch.randn(2, 3, 32, 32)
    host.eval()
    before = host(x)
    slot = host.slots["r0c1"]
    slot.germinate("conv_light")
    assert len(host.host_parameters()) == len(list(host.parameters())) - len(
        slot.seed_parameters()
    )
    slot.advance()
    assert torch.equal(host(x), before)  # incubating: value unchanged
    slot.state.metrics.epochs_in_stage = 10
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    slot.advance()
    slot.tick()
    assert slot.stage == SeedStage.BLENDING and slot.alpha > 0
    assert not torch.equal(host(x), before)


def test_trainer_fits_two_epochs_on_fixture(cifar_dir, tmp_path):
    torch.manual_seed(0)
    dm = CIFAR10DataModule(cifar_dir, batch_size=16)
    host = CifarCNNHost("baseline")
    trainer = L.Trainer(
        max_epochs=2,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(host, datamodule=dm)
    metrics = trainer.callback_metrics
    assert trainer.current_epoch == 2
    assert torch.isfinite(metrics["val_loss"])
    assert 0.0 <= float(metrics["val_acc"]) <= 1.0
    assert {"train_loss", "val_loss", "val_acc"} <= set(metrics)


def test_validation_accuracy_is_exact_over_the_split(cifar_dir, tmp_path):
    # 20 validation images (the first half of the test batch) in batches of 16 and 4: correct /
    # total over the whole split.
    torch.manual_seed(0)
    dm = CIFAR10DataModule(cifar_dir, batch_size=16)
    host = CifarCNNHost("baseline")
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    metrics = trainer.validate(host, datamodule=dm, verbose=False)[0]
    correct = total = 0
    host.eval()
    with torch.no_grad():
        for x, y in dm.val_dataloader():
            correct += int((host(x).argmax(1) == y).sum())
            total += len(y)
    assert total == 20 and metrics["val_acc"] == pytest.approx(correct / total)
    assert "val_accuracy.tp" not in "".join(host.state_dict())  # metric states not saved
    assert host.configure_optimizers().param_groups[0]["name"] == "host"
