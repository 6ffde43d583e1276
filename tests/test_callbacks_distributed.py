"""MorphogenesisCallback and GovernorCallback under DDP: two CPU processes (gloo) started by
Lightning's own launcher (``ddp_fork``: the workers inherit the imported modules, so a run takes
seconds) against one process that sees the same global batch."""

from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import local_rendezvous
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from esper_lightning.callbacks import GovernorCallback, MorphogenesisCallback
from esper_lightning.callbacks._distributed import check_strategy, keep_slots_out_of_ddp
from esper_lightning.controllers import GrowerController
from esper_lightning.core.actions import Action
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import GateConfig, SeedStage

WORLD = 2
BATCH = 8  # per rank; the single process takes WORLD * BATCH, the same global batch
EPOCHS = 10
NAN_AT = (EPOCHS - 2, 1)  # (epoch, batch): after the seed was fossilized
#: Two ranks against one process: the same sums in another order (float32 rounding only).
ATOL = 1e-5


class TinyNet(L.LightningModule):
    """A small CNN; on rank ``nan_rank`` the loss of batch ``NAN_AT`` is NaN."""

    def __init__(self, nan_rank: int | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
        )
        self.nan_rank = nan_rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if (self.current_epoch, batch_idx) == NAN_AT and self.global_rank == self.nan_rank:
            loss = loss * float("nan")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        return self._loader(64, 1)

    def val_dataloader(self) -> DataLoader:
        return self._loader(32, 2)

    def _loader(self, n: int, rng_seed: int) -> DataLoader:
        """Rank r reads samples r, r + W, ... in order (Lightning's own sampler would shuffle
        the training set), so two ranks' batches together are the single process's batch."""
        g = torch.Generator().manual_seed(rng_seed)
        x = torch.randn(n, 3, 6, 6, generator=g)
        teacher = torch.randn(3, 4, generator=torch.Generator().manual_seed(99))
        y = (x.mean((2, 3)) @ teacher).argmax(1)
        world = self.trainer.world_size
        sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world,
                                     rank=self.global_rank, shuffle=False)
        return DataLoader(TensorDataset(x, y), batch_size=BATCH * WORLD // world,
                          sampler=sampler)


class RankGrower(GrowerController):
    """Grows on rank 0 and waits on every other rank: a controller whose decisions differ per
    rank, as a stochastic one's may. Only rank 0's decision may count."""

    def decide(self, report):
        action = super().decide(report)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        return action if rank == 0 else Action()


class RankSeeds(L.Callback):
    """Seeds the global generator per rank before the growth callback's setup, so only rank 0's
    broadcast ``rng_seed`` can make the new seeds' weights equal."""

    def setup(self, trainer, pl_module, stage):
        torch.manual_seed(100 + trainer.global_rank)


class Record(L.Callback):
    """Writes what each rank holds at the end of the fit (and rank 0's checkpoint)."""

    def __init__(self, out: Path, tag: str, checkpoint: bool = False) -> None:
        self.out, self.tag, self.checkpoint = out, tag, checkpoint
        self.at_start: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer, pl_module):
        self.at_start = _tensors(pl_module)

    def on_fit_end(self, trainer, pl_module):
        morpho = next(c for c in trainer.callbacks if isinstance(c, MorphogenesisCallback))
        governor = next(c for c in trainer.callbacks if isinstance(c, GovernorCallback))
        engine = morpho.engine
        torch.save({
            "state": _tensors(pl_module), "at_start": self.at_start,
            "manifests": {sid: slot.manifest() for sid, slot in engine.slots.items()},
            "events": [asdict(e) for e in engine.events],
            "timeline": [asdict(e) for e in engine.timeline],
            "rollbacks": governor.rollbacks, "rng_seed": engine.rng_seed,
            "accuracy": list(engine.accuracy_history), "train_loss": engine.train_loss,
        }, self.out / f"{self.tag}_rank{trainer.global_rank}.pt")
        if self.checkpoint:  # every rank calls it, rank 0 writes
            trainer.save_checkpoint(self.out / f"{self.tag}.ckpt")


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()
            if isinstance(v, torch.Tensor)}


def _fit(out: Path, tag: str, epochs: int = EPOCHS, ckpt: Path | None = None,
         **trainer_options) -> None:
    world = trainer_options.get("devices", 1)
    torch.manual_seed(0)
    module = TinyNet(nan_rank=WORLD - 1 if world > 1 else 0)
    growth = MorphogenesisCallback(RankGrower("conv_light"), slots=["net.1"],
                                   gate_config=GateConfig(min_training_epochs=1))
    callbacks = [RankSeeds(), GovernorCallback(), growth,
                 Record(out, tag, checkpoint=world > 1)]
    trainer = L.Trainer(
        max_epochs=epochs, accelerator="cpu", callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, use_distributed_sampler=False, **trainer_options,
    )
    trainer.fit(module, ckpt_path=ckpt)





@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> SimpleNamespace:
    out = tmp_path_factory.mktemp("ddp")
    with local_rendezvous():
        _fit(out, "ddp", strategy="ddp_fork", devices=WORLD)
    assert not torch.distributed.is_initialized()  # the workers held the process group
    _fit(out, "single")
    _fit(out, "resumed", epochs=EPOCHS + 1, ckpt=out / "ddp.ckpt")
    load = lambda name: torch.load(out / f"{name}.pt", weights_only=False)  # noqa: E731
    return SimpleNamespace(ranks=[load(f"ddp_rank{r}") for r in range(WORLD)],
                           single=load("single_rank0"), resumed=load("resumed_rank0"))


def _stages(record) -> list[tuple[int, str]]:
    return [(e["epoch"], e["stage"]) for e in record["timeline"]]


def test_every_rank_holds_the_same_lifecycle_and_bitwise_the_same_weights(runs):
    first, other = runs.ranks
    kinds = [e["kind"] for e in first["events"]]
    assert kinds == ["germinated", "fossilized"]  # germinated, blended, kept
    assert "BLENDING" in {stage for _, stage in _stages(first)}
    assert other["rng_seed"] == first["rng_seed"] == 100  # rank 0's (the ranks seeded apart)
    assert other["events"] == first["events"] and other["timeline"] == first["timeline"]
    assert other["manifests"] == first["manifests"]  # measurements, gate results, alpha
    assert other["accuracy"] == first["accuracy"] and other["train_loss"] == first["train_loss"]
    assert other["state"].keys() == first["state"].keys()
    assert any(".seed." in k for k in first["state"])
    for key, value in first["state"].items():
        assert torch.equal(other["state"][key], value), key


def test_two_ranks_match_one_process_of_the_same_global_batch(runs):
    ddp, single = runs.ranks[0], runs.single
    assert _stages(ddp) == _stages(single)
    assert [(e["epoch"], e["kind"]) for e in ddp["events"]] == \
        [(e["epoch"], e["kind"]) for e in single["events"]]
    assert ddp["accuracy"] == pytest.approx(single["accuracy"], abs=1e-9)  # exact counts
    assert ddp["train_loss"] == pytest.approx(single["train_loss"], abs=ATOL)
    for key, value in single["state"].items():
        torch.testing.assert_close(ddp["state"][key], value, atol=ATOL, rtol=0, msg=key)


def test_a_nan_on_one_rank_rolls_every_rank_back(runs):
    assert [r["rollbacks"] for r in runs.ranks] == [1, 1] and runs.single["rollbacks"] == 1
    for record in runs.ranks:
        assert all(torch.isfinite(v).all() for v in record["state"].values())
        assert record["manifests"]["net.1"]["state"]["stage"] == SeedStage.FOSSILIZED


def test_a_checkpoint_written_by_rank_0_resumes_in_one_process(runs):
    saved, resumed = runs.ranks[0], runs.resumed
    for key, value in saved["state"].items():  # the grown model came back before training
        assert torch.equal(resumed["at_start"][key], value), key
    assert resumed["events"] == saved["events"]
    assert _stages(resumed)[: len(saved["timeline"])] == _stages(saved)
    assert max(epoch for epoch, _ in _stages(resumed)) == EPOCHS  # one more decision


def test_sharded_strategies_are_refused_in_one_line():
    for strategy in (FSDPStrategy(), DeepSpeedStrategy.__new__(DeepSpeedStrategy)):
        with pytest.raises(MisconfigurationException, match=r"^MorphogenesisCallback supports "
                           r"strategy='auto' on one device, or 'ddp' .* got \w+Strategy$"):
            check_strategy(SimpleNamespace(strategy=strategy))
    check_strategy(SimpleNamespace(strategy=DDPStrategy()))


def _prune_under_ddp(keep_out: bool) -> None:
    torch.manual_seed(0)
    module = TinyNet()
    engine = MorphogenesisEngine(module, slots=["net.1"])
    module(torch.zeros(1, 3, 6, 6))  # the slot learns its width
    slot = engine.slots["net.1"]
    slot.germinate("conv_light")  # as if restored from a checkpoint before DDP wraps the model
    slot.advance()  # TRAINING: the seed is in the graph
    if keep_out:
        keep_slots_out_of_ddp(module)
    ddp = DistributedDataParallel(module)
    ignored = {n for n, _ in module.named_parameters() if ".seed." in n}
    assert (ignored <= ddp.parameters_to_ignore) == keep_out
    ddp(torch.randn(2, 3, 6, 6)).sum().backward()
    slot.prune("test")
    for _ in range(2):  # DDP notices the missing gradient at the next step
        ddp(torch.randn(2, 3, 6, 6)).sum().backward()


def test_slots_stay_out_of_ddp_so_a_pruned_seed_leaves_it_no_gradient_to_wait_for(tmp_path):
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        _prune_under_ddp(keep_out=True)
        with pytest.raises(RuntimeError, match="finished reduction in the prior iteration"):
            _prune_under_ddp(keep_out=False)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_ddp_spawn_gives_what_ddp_fork_gives(runs, tmp_path):
    """``ddp_spawn`` pickles the trainer into fresh interpreters (slow: each imports torch and
    Lightning); the result is the fork launch's, bit for bit."""
    with local_rendezvous():
        _fit(tmp_path, "spawn", strategy="ddp_spawn", devices=WORLD)
    for r, forked in enumerate(runs.ranks):
        spawned = torch.load(tmp_path / f"spawn_rank{r}.pt", weights_only=False)
        assert spawned["events"] == forked["events"]
        assert spawned["manifests"] == forked["manifests"]
        for key, value in forked["state"].items():
            assert torch.equal(spawned["state"][key], value), key
