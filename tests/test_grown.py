"""load_grown / restore_slots: a real Trainer fit with MorphogenesisCallback, then from disk."""

import logging
import re
import shutil
import textwrap
from pathlib import Path

import lightning as L
import pytest
import torch
from fresh_process import run_without_package
from helpers import UserModule, one_line_message
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from esper_lightning import load_grown
from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import ScriptedController
from esper_lightning.core import SeedSlot, SeedStage, export, find_slots
from esper_lightning.core.actions import Action, LifecycleOp, Tempo
from esper_lightning.core.injection import restore_slots
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.hosts import CifarCNNHost

EXPORT_PAGE = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "export.md"

FAST_GATES = GateConfig(min_training_epochs=1)


def germinate(slot: int, blueprint: str) -> Action:
    return Action(LifecycleOp.GERMINATE, slot, blueprint=blueprint, tempo=Tempo.FAST)


def advance(slot: int) -> Action:
    return Action(LifecycleOp.ADVANCE, slot)


class HookedModule(UserModule):
    """The direct path: ``load_from_checkpoint`` works once the module restores its slots."""

    def on_load_checkpoint(self, checkpoint):
        restore_slots(self, checkpoint["state_dict"])


def _loaders() -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(48, 3, 8, 8, generator=generator)
    y = torch.randint(0, 10, (48,), generator=generator)
    return (DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16),
            DataLoader(TensorDataset(x[32:], y[32:]), batch_size=16))


class _Records(logging.Handler):
    """Keeps the messages of Lightning's rank-zero logger (it does not propagate to pytest's
    caplog when the root logger has no handler)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _told_to_load_grown(fit) -> list[str]:
    """The callback's messages naming ``load_grown`` (Lightning's rank-zero logger) in fit()."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    records = _Records()
    logger.addHandler(records)
    try:
        fit()
    finally:
        logger.removeHandler(records)
    return [m for m in records.messages
            if m.startswith("MorphogenesisCallback") and "load_grown" in m]


def _fit(module: L.LightningModule, tmp_path: Path, epochs: int, script, slots,
         ckpt_path: Path | None = None) -> Path:
    torch.manual_seed(0)
    callback = MorphogenesisCallback(ScriptedController(script), slots=slots,
                                     gate_config=FAST_GATES)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = L.Trainer(
        max_epochs=epochs, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, callbacks=[callback, checkpoint],
    )
    trainer.fit(module, *_loaders(), ckpt_path=ckpt_path)
    return tmp_path / "ckpt" / "last.ckpt"


def _assert_same_growth(trained: nn.Module, loaded: nn.Module) -> None:
    mine, theirs = find_slots(trained), find_slots(loaded)
    assert mine.keys() == theirs.keys()
    for slot_id, slot in mine.items():
        other = theirs[slot_id]
        assert (other.stage, other.report().blueprint) == (slot.stage, slot.report().blueprint)
        assert other.manifest() == slot.manifest()
    x = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    trained.eval(), loaded.eval()
    assert torch.equal(loaded(x), trained(x))


# ScriptedController: slot 0 (net.1) grows to BLENDING mid-ramp, slot 1 (net.4) is germinated.
INJECTED_SCRIPT = {0: germinate(0, "conv_light"), 1: advance(0), 2: advance(0),
                   3: germinate(1, "attention")}


def test_load_grown_restores_injected_slots_exactly(tmp_path):
    module = UserModule(width=6)
    told = _told_to_load_grown(
        lambda: _fit(module, tmp_path, 4, INJECTED_SCRIPT, ["net.1", "net.4"]))
    last = tmp_path / "ckpt" / "last.ckpt"
    slots = find_slots(module)
    assert slots["net.1"].stage == SeedStage.BLENDING and 0 < slots["net.1"].alpha < 1
    assert slots["net.4"].stage == SeedStage.GERMINATED
    # Once per fit (checkpoints were saved after every epoch), one line, where they are written.
    assert told == ["MorphogenesisCallback: checkpoints of this fit hold the seed slots it "
                    "injected into UserModule (esper_slots.*): load them with "
                    "esper_lightning.load_grown(UserModule, path); "
                    "UserModule.load_from_checkpoint alone refuses those keys"]

    # Why load_grown exists: a fresh UserModule has no esper_slots for the saved seeds, and
    # Lightning's load_from_checkpoint runs nothing of the callback's before its strict load.
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "esper_slots\.'):
        UserModule.load_from_checkpoint(last)

    loaded = load_grown(UserModule, last)
    assert type(loaded) is UserModule and loaded.hparams.width == 6
    assert isinstance(loaded.esper_slots["net__1"], SeedSlot)
    _assert_same_growth(module, loaded)
    # The forward hook is live: the blended seed changes the output.
    x = torch.randn(3, 3, 8, 8)
    with find_slots(loaded)["net.1"].alpha_override(torch.zeros(3)):
        assert not torch.equal(loaded(x), module(x))

    # Another class than the one that wrote it: one line naming the class and the call.
    class Other(L.LightningModule):
        def __init__(self, width: int = 6) -> None:
            super().__init__()
            self.head = nn.Linear(width, 2)

    with pytest.raises(ValueError) as err:
        load_grown(Other, last)
    message = one_line_message(err)
    assert message.startswith(f"load_grown(test_load_grown_restores_injected_slots_exactly."
                              f"<locals>.Other, '{last}'): the checkpoint does not fit ")
    assert message.endswith("; pass the LightningModule class that wrote it")

    # The direct path: a module that restores its slots in on_load_checkpoint.
    _assert_same_growth(module, HookedModule.load_from_checkpoint(last))
    _assert_same_growth(module, load_grown(HookedModule, last))
    # ... and a resumed fit of it still runs each slot once, through the callback's slots.
    resumed = HookedModule(width=6)
    told = _told_to_load_grown(lambda: _fit(resumed, tmp_path, 5, INJECTED_SCRIPT,
                                            ["net.1", "net.4"], ckpt_path=last))
    assert len(told) == 1 and "load_grown(HookedModule, path)" in told[0]  # a new fit: again
    assert find_slots(resumed)["net.1"].alpha > slots["net.1"].alpha
    assert len(resumed.net[1]._forward_hooks) == len(resumed.net[4]._forward_hooks) == 1


def test_cifar_host_grows_a_fossil_loads_and_ships(tmp_path):
    host = CifarCNNHost("baseline", slots=["r0c1", "r1c1"])
    script = {0: germinate(0, "conv_small"), 1: advance(0), 2: advance(0),
              5: advance(0), 6: Action(LifecycleOp.FOSSILIZE, 0)}
    told = _told_to_load_grown(lambda: _fit(host, tmp_path, 7, script, None))
    last = tmp_path / "ckpt" / "last.ckpt"
    assert host.slots["r0c1"].stage == SeedStage.FOSSILIZED
    assert told == []  # slots the class declares load with its own load_from_checkpoint
    _assert_same_growth(host, CifarCNNHost.load_from_checkpoint(last))

    loaded = load_grown(CifarCNNHost, last)
    assert loaded.hparams.slots == ["r0c1", "r1c1"] and not hasattr(loaded, "esper_slots")
    _assert_same_growth(host, loaded)
    x = torch.randn(4, 3, 8, 8)
    shipped = export(loaded, x)
    torch.testing.assert_close(shipped(x), host(x), rtol=0, atol=1e-5)


def export_page_snippets() -> list[str]:
    """The python blocks of docs/how-to/export.md, as written."""
    return re.findall(r"```python\n(.*?)```", EXPORT_PAGE.read_text(), flags=re.DOTALL)


#: Runs the export page's loading snippet per batch saved in argv[1]; saves the logits to argv[2].
LOADING_SNIPPET = """
import torch
outputs = []
for batch in torch.load(sys.argv[1]):
{snippet}
    outputs.append(logits.detach())
torch.save(outputs, sys.argv[2])
"""


def test_the_export_pages_recipe_runs_any_batch_without_the_package(tmp_path, monkeypatch):
    save, load = export_page_snippets()
    script = {0: germinate(0, "conv_small"), 1: advance(0), 2: advance(0),
              5: advance(0), 6: Action(LifecycleOp.FOSSILIZE, 0)}
    module = UserModule()
    last = _fit(module, tmp_path, 7, script, ["net.1"])
    assert find_slots(module)["net.1"].stage == SeedStage.FOSSILIZED
    (tmp_path / "checkpoints").mkdir()
    shutil.copy(last, tmp_path / "checkpoints" / "last.ckpt")
    monkeypatch.chdir(tmp_path)
    generator = torch.Generator().manual_seed(5)
    example_batch = torch.randn(32, 3, 8, 8, generator=generator)
    exec(save, {"MyModule": UserModule, "example_batch": example_batch})

    batches = [torch.randn(b, 3, 8, 8, generator=generator) for b in (1, 3, 17)]
    torch.save(batches, tmp_path / "batches.pt")
    run_without_package(LOADING_SNIPPET.format(snippet=textwrap.indent(load, "    ")),
                        tmp_path / "batches.pt", tmp_path / "logits.pt")
    module.eval()
    for x, logits in zip(batches, torch.load(tmp_path / "logits.pt"), strict=True):
        torch.testing.assert_close(logits, module(x), rtol=1e-5, atol=1e-6)


def test_errors_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^no checkpoint file at '.*missing\.ckpt'$"):
        load_grown(UserModule, tmp_path / "missing.ckpt")
    plain = tmp_path / "weights.pt"
    torch.save({"net.0.weight": torch.zeros(1)}, plain)
    with pytest.raises(ValueError, match=r"weights\.pt' is not a Lightning checkpoint \(it needs"):
        load_grown(UserModule, plain)
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"^cannot read '.*notes\.ckpt' as a torch checkpoint: "):
        load_grown(UserModule, text)
    with pytest.raises(TypeError) as err:
        load_grown(nn.Linear, plain)
    assert str(err.value) == ("load_grown needs a LightningModule subclass (the class, e.g. "
                              "load_grown(MyModule, path)), got the class Linear")
    with pytest.raises(TypeError) as err:  # an instance: named by its class, not its repr
        load_grown(UserModule(), plain)
    assert str(err.value).endswith("got an instance of UserModule")
    for path in (plain, str(plain)):  # the arguments swapped: a path where the class goes
        with pytest.raises(TypeError, match=r"got an instance of (PosixPath|str)$"):
            load_grown(path, UserModule)
    with pytest.raises(ValueError, match="load_grown always loads strictly; drop strict=False"):
        load_grown(UserModule, plain, strict=False)


def test_restore_slots_rejects_a_foreign_manifest():
    model = UserModule()
    manifest = {"slot_id": "net.4", "topology": "cnn"}
    with pytest.raises(ValueError, match=r"'esper_slots\.net__1\._extra_state' holds the manifest "
                                         r"of slot 'net\.4'"):
        restore_slots(model, {"esper_slots.net__1._extra_state": manifest})
    with pytest.raises(ValueError, match=r"unknown slot 'net\.9'"):
        restore_slots(model, {"esper_slots.net__9._extra_state": {"slot_id": "net.9",
                                                                   "topology": "cnn"}})
    assert restore_slots(model, {"esper_slots.net__4._extra_state": manifest}) == ("net.4",)
    assert isinstance(model.esper_slots["net__4"], SeedSlot)
