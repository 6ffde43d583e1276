"""CIFAR10DataModule: loaders, subsets, argument checks and epoch-seeded reproducibility."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers import epoch_batches, same_batches
from torch import nn

from esper_lightning.data import CIFAR10_MEAN, CIFAR10_STD, CIFAR10DataModule, load_cifar10
from esper_lightning.data import datamodule as datamodule_module
from esper_lightning.data.datamodule import EpochSampler
from esper_lightning.data.tensor_loader import PAD, normalize


def _dm(cifar_dir: Path, **kwargs: Any) -> CIFAR10DataModule:
    dm = CIFAR10DataModule(cifar_dir, **{"batch_size": 16, **kwargs})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_loaders_give_normalised_batches(cifar_dir: Path) -> None:
    dm = _dm(cifar_dir)
    assert dm.num_classes == 10
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (16,) and y.dtype == torch.int64
    assert -3 < x.mean() < 3 and x.std() > 0.1
    assert len(dm.train_dataloader()) == 5


def test_val_and_test_are_the_halves_of_the_test_batch_in_order(cifar_dir: Path) -> None:
    dm = _dm(cifar_dir)
    assert dm.test_set is None  # a fit never reads the test half
    dm.setup("test")
    images, labels = load_cifar10(cifar_dir, train=False)
    for loader, half in ((dm.val_dataloader(), slice(0, 20)), (dm.test_dataloader(),
                                                               slice(20, 40))):
        x = torch.cat([b[0] for b in loader])
        y = torch.cat([b[1] for b in loader])
        assert torch.equal(x, normalize(images[half])) and torch.equal(y, labels[half])


def test_setup_test_stage_skips_train_split(cifar_dir: Path) -> None:
    dm = CIFAR10DataModule(cifar_dir)
    dm.setup("test")
    assert dm.train_set is None and len(dm.test_set or []) == 20
    with pytest.raises(RuntimeError, match="setup"):
        dm.train_dataloader()


def test_subsets_are_seeded(cifar_dir: Path) -> None:
    dm = _dm(cifar_dir, subset=30, val_subset=12, rng_seed=1)
    assert len(dm.train_set or []) == 30 and len(dm.val_set or []) == 12
    same = _dm(cifar_dir, subset=30, val_subset=12, rng_seed=1)
    other = _dm(cifar_dir, subset=30, val_subset=12, rng_seed=2)
    assert torch.equal(dm.train_set.images, same.train_set.images)  # type: ignore[union-attr]
    assert not torch.equal(dm.train_set.images, other.train_set.images)  # type: ignore[union-attr]


def test_subset_larger_than_split_is_a_clear_error(cifar_dir: Path) -> None:
    dm = CIFAR10DataModule(cifar_dir, subset=81)
    with pytest.raises(ValueError, match="subset=81 exceeds the 80"):
        dm.setup("fit")


def test_order_is_a_function_of_seed_and_epoch(cifar_dir: Path) -> None:
    a, b, c = _dm(cifar_dir), _dm(cifar_dir), _dm(cifar_dir, rng_seed=1)
    assert same_batches(epoch_batches(a, 3), epoch_batches(b, 3))
    assert not torch.equal(epoch_batches(a, 0)[0][1], epoch_batches(a, 1)[0][1])
    assert not torch.equal(epoch_batches(a, 0)[0][1], epoch_batches(c, 0)[0][1])
    # rng_seed + epoch is the generator seed: (rng_seed=0, epoch=1) == (rng_seed=1, epoch=0).
    assert same_batches(epoch_batches(a, 1), epoch_batches(c, 0))


def test_workers_do_not_change_the_batches(cifar_dir: Path) -> None:
    in_process = epoch_batches(_dm(cifar_dir, rng_seed=5), 2)
    with_workers = epoch_batches(_dm(cifar_dir, rng_seed=5, num_workers=2), 2)
    assert same_batches(in_process, with_workers)


def test_augmentation_keeps_shape_and_pads_with_zero_pixels(cifar_dir: Path) -> None:
    dm = _dm(cifar_dir)
    plain = _dm(cifar_dir, augment=False)
    x_aug, y_aug = map(torch.cat, zip(*epoch_batches(dm, 0), strict=True))
    x_plain, y_plain = map(torch.cat, zip(*epoch_batches(plain, 0), strict=True))
    assert x_aug.shape == x_plain.shape == (80, 3, 32, 32)
    assert torch.equal(y_aug, y_plain)  # augmentation does not change the order
    assert not torch.equal(x_aug, x_plain)
    pad = (-torch.tensor(CIFAR10_MEAN) / torch.tensor(CIFAR10_STD)).view(1, 3, 1)
    # A crop offset of 0 rows brings PAD rows of padding into view at the top.
    top_rows_padded = (x_aug[:, :, :PAD, :] == pad.unsqueeze(-1)).all(dim=(1, 2, 3))
    assert top_rows_padded.any()


def test_flip_really_flips(cifar_dir: Path) -> None:
    dm = _dm(cifar_dir)
    collate = datamodule_module._Collate(augment=True)
    key = datamodule_module._Key(index=0, dy=PAD, dx=PAD, flip=True)
    x, _ = collate([dm.train_set[key]])  # type: ignore[index]
    assert torch.equal(x, normalize(dm.train_set.images[:1]).flip(-1))  # type: ignore[union-attr]


def test_sampler_draws_every_index_once_with_varied_augmentation() -> None:
    sampler = EpochSampler(50, rng_seed=0)
    keys = list(sampler)
    assert sorted(k.index for k in keys) == list(range(50))
    assert {k.dy for k in keys} > {PAD} and 0 < sum(k.flip for k in keys) < 50
    plain = list(EpochSampler(5, rng_seed=0, shuffle=False, augment=False))
    assert [tuple(k) for k in plain] == [(i, PAD, PAD, False) for i in range(5)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        ({"batch_size": 2.0}, "batch_size"),
        ({"subset": 0}, "subset must be an int >= 1 or None, got 0"),
        ({"val_subset": "10"}, "val_subset"),
        ({"num_workers": -1}, "num_workers"),
        ({"rng_seed": True}, "rng_seed"),
        ({"download": "yes"}, "download must be True or False"),
        ({"augment": 1}, "augment"),
        ({"data_dir": 3}, "data_dir"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CIFAR10DataModule(**kwargs)


def test_default_data_dir_from_env(monkeypatch: pytest.MonkeyPatch, cifar_dir: Path) -> None:
    monkeypatch.setenv("ESPER_DATA_DIR", str(cifar_dir))
    dm = CIFAR10DataModule()
    assert dm.data_dir == cifar_dir
    dm.setup("fit")
    assert len(dm.train_set or []) == 80


def test_prepare_data_downloads_only_when_asked_and_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cifar_dir: Path
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(datamodule_module, "download_cifar10", calls.append)
    CIFAR10DataModule(tmp_path / "empty").prepare_data()
    CIFAR10DataModule(cifar_dir, download=True).prepare_data()
    assert calls == []
    CIFAR10DataModule(tmp_path / "empty", download=True).prepare_data()
    assert calls == [tmp_path / "empty"]


def test_state_dict_round_trip_and_mismatch_warning(cifar_dir: Path) -> None:
    dm = CIFAR10DataModule(cifar_dir, rng_seed=3, subset=10)
    state = dm.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CIFAR10DataModule(cifar_dir, rng_seed=3, subset=10).load_state_dict(state)
    with pytest.warns(UserWarning, match="rng_seed=4 but the checkpoint used rng_seed=3"):
        CIFAR10DataModule(cifar_dir, rng_seed=4, subset=10).load_state_dict(state)


class _Recorder(L.LightningModule):
    """Records the labels of every training batch, per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3 * 32 * 32, 10)
        self.labels: dict[int, list[torch.Tensor]] = {}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        self.labels.setdefault(self.current_epoch, []).append(y)
        return nn.functional.cross_entropy(self.head(x.flatten(1)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_trainer_epochs_follow_seed_plus_epoch(cifar_dir: Path, tmp_path: Path) -> None:
    dm = CIFAR10DataModule(cifar_dir, batch_size=16, rng_seed=11)
    model = _Recorder()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "few workers" hints are irrelevant here
        trainer.fit(model, datamodule=dm)
    for epoch in (0, 1):
        expected = torch.cat([y for _, y in epoch_batches(dm, epoch)])
        assert torch.equal(torch.cat(model.labels[epoch]), expected)


def test_sampler_stream_is_pinned() -> None:
    # Drawn before the sampler moved onto EpochSeededSampler; a change here breaks replays.
    sampler = EpochSampler(40, rng_seed=0)
    sampler.set_epoch(3)
    assert [tuple(k) for k in list(sampler)[:3]] == [(26, 7, 1, True), (33, 5, 7, False),
                                                     (37, 8, 7, False)]
    plain = EpochSampler(40, rng_seed=1, augment=False)
    plain.set_epoch(1)
    assert [k.index for k in list(plain)[:6]] == [8, 10, 29, 0, 30, 19]
