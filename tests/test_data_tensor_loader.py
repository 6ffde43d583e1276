"""TensorLoader: device-resident batches, vectorised augmentation, exact resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import same_batches

from esper_lightning.data import CIFAR10_MEAN, CIFAR10_STD, TensorLoader
from esper_lightning.data.tensor_loader import PAD, crop_flip, normalize

N = 40


def _data(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(123)
    images = torch.randint(1, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=generator)
    return images, torch.arange(n)  # label == index identifies each sample's source image


def _stream(loader: TensorLoader, epochs: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [batch for _ in range(epochs) for batch in loader]


def _pad_value() -> torch.Tensor:
    return (-torch.tensor(CIFAR10_MEAN) / torch.tensor(CIFAR10_STD)).view(3, 1, 1)


# ------------------------------------------------------------------------- augmentation ops


def test_normalize_maps_zero_to_minus_mean_over_std() -> None:
    out = normalize(torch.zeros(2, 3, 4, 4, dtype=torch.uint8))
    assert out.dtype == torch.float32
    assert torch.allclose(out[0], _pad_value().expand(3, 4, 4))


def test_crop_flip_identity_flip_and_shift() -> None:
    images, _ = _data(3)
    centre = torch.full((3,), PAD)
    no_flip, flip = torch.zeros(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool)
    assert torch.equal(crop_flip(images, centre, centre, no_flip), images)
    assert torch.equal(crop_flip(images, centre, centre, flip), images.flip(-1))
    # Offset 0 shows the top/left padding: the image moves down/right by PAD pixels.
    shifted = crop_flip(images, torch.zeros(3, dtype=torch.long), centre, no_flip)
    assert (shifted[:, :, :PAD] == 0).all()
    assert torch.equal(shifted[:, :, PAD:], images[:, :, :-PAD])
    both = crop_flip(images, centre, torch.full((3,), 2 * PAD), flip)
    assert torch.equal(
        both, torch.nn.functional.pad(images, (PAD,) * 4)[:, :, PAD:-PAD, 8:].flip(-1)
    )


def _all_variants(images: torch.Tensor) -> torch.Tensor:
    """Every crop/flip of every image, normalised: ``[N, 2 * 9 * 9, 3, 32, 32]``."""
    n, offsets = len(images), torch.arange(2 * PAD + 1)
    dy, dx, flip = torch.meshgrid(offsets, offsets, torch.arange(2), indexing="ij")
    dy, dx, flip = dy.reshape(-1), dx.reshape(-1), flip.reshape(-1).bool()
    k = len(dy)
    repeated = images.repeat_interleave(k, dim=0)
    variants = crop_flip(repeated, dy.repeat(n), dx.repeat(n), flip.repeat(n))
    return normalize(variants).view(n, k, 3, 32, 32)


def test_augmented_batches_are_valid_crops_and_flips() -> None:
    images, labels = _data()
    variants = _all_variants(images)
    loader = TensorLoader(images, labels, batch_size=16, rng_seed=1)
    flips = 0
    for x, y in loader:
        assert x.shape[1:] == (3, 32, 32) and x.dtype == torch.float32
        for sample, label in zip(x, y.tolist(), strict=True):
            matches = (variants[label] == sample).flatten(1).all(dim=1).nonzero().flatten()
            assert len(matches) >= 1, "output is not a crop/flip of its source image"
            flips += int(matches[0] % 2)  # odd variant index = flipped (meshgrid order)
    assert 0 < flips < N  # both flipped and unflipped samples occur


def test_pad_appears_as_minus_mean_over_std() -> None:
    images, labels = _data()
    x = torch.cat([batch[0] for batch in TensorLoader(images, labels, batch_size=N, rng_seed=0)])
    # Source pixels are >= 1, so an exact -mean/std pixel can only be padding.
    is_pad = (x == _pad_value()).all(dim=1)
    assert is_pad.any()


# ------------------------------------------------------------------------------- the loader


@pytest.mark.parametrize(("drop_last", "expected"), [(False, 3), (True, 2)])
def test_len_is_number_of_batches(drop_last: bool, expected: int) -> None:
    loader = TensorLoader(*_data(), batch_size=16, drop_last=drop_last)
    assert len(loader) == expected
    batches = _stream(loader)
    assert len(batches) == expected
    assert [len(y) for _, y in batches] == ([16, 16, 8] if not drop_last else [16, 16])


def test_epoch_covers_every_sample_once() -> None:
    loader = TensorLoader(*_data(), batch_size=16, rng_seed=0)
    seen = torch.cat([y for _, y in loader])
    assert torch.equal(seen.sort().values, torch.arange(N))


def test_plain_loader_is_normalised_data_in_order() -> None:
    images, labels = _data()
    loader = TensorLoader(images, labels, batch_size=N, shuffle=False, augment=False)
    ((x, y),) = _stream(loader)
    assert torch.equal(x, normalize(images)) and torch.equal(y, labels)


def test_same_seed_same_batches_different_seed_different_order() -> None:
    data = _data()
    a = _stream(TensorLoader(*data, batch_size=16, rng_seed=7), epochs=2)
    b = _stream(TensorLoader(*data, batch_size=16, rng_seed=7), epochs=2)
    c = _stream(TensorLoader(*data, batch_size=16, rng_seed=8), epochs=2)
    assert same_batches(a, b)
    assert not torch.equal(a[0][1], c[0][1])
    assert not torch.equal(torch.cat([y for _, y in a[:3]]), torch.cat([y for _, y in a[3:]]))


def test_reseed_restarts_the_stream() -> None:
    data = _data()
    loader = TensorLoader(*data, batch_size=16, rng_seed=1)
    _stream(loader)
    loader.reseed(5)
    assert same_batches(_stream(loader), _stream(TensorLoader(*data, batch_size=16, rng_seed=5)))


@pytest.mark.parametrize("stop_after", [0, 1, 3])
def test_state_dict_resumes_exactly(stop_after: int) -> None:
    data = _data()
    reference = _stream(TensorLoader(*data, batch_size=16, rng_seed=3), epochs=3)
    loader = TensorLoader(*data, batch_size=16, rng_seed=3)
    consumed = _stream(loader)  # one full epoch
    iterator = iter(loader)
    consumed += [next(iterator) for _ in range(stop_after)]  # part of the next epoch
    state = loader.state_dict()
    resumed = TensorLoader(*data, batch_size=16, rng_seed=99)
    resumed.load_state_dict(state)
    again = resumed.state_dict()
    assert again["position"] == state["position"] and torch.equal(
        again["generator"], state["generator"]
    )
    rest = [*resumed, *resumed]
    assert same_batches(consumed + rest[: len(reference) - len(consumed)], reference)
    assert resumed.rng_seed == 3


def test_breaking_out_starts_a_new_epoch() -> None:
    data = _data()
    loader = TensorLoader(*data, batch_size=16, rng_seed=2)
    for _ in loader:
        break
    assert loader.epoch == 1 and loader.state_dict()["position"] == 0
    twin = TensorLoader(*data, batch_size=16, rng_seed=2)
    twin.load_state_dict(loader.state_dict())
    assert same_batches(_stream(loader), _stream(twin))


def test_from_cifar10_with_subset(cifar_dir: Path) -> None:
    loader = TensorLoader.from_cifar10(
        cifar_dir, train=True, batch_size=8, device="cpu", subset=20, rng_seed=4, augment=False
    )
    assert loader.num_samples == 20 and len(loader) == 3 and loader.rng_seed == 4
    x, y = next(iter(loader))
    assert x.shape == (8, 3, 32, 32) and y.dtype == torch.int64


@pytest.mark.parametrize(
    ("images", "labels", "batch_size", "match"),
    [
        (torch.zeros(4, 3, 32, 32), torch.zeros(4, dtype=torch.long), 2, "uint8"),
        (torch.zeros(4, 1, 32, 32, dtype=torch.uint8), torch.zeros(4, dtype=torch.long), 2, "3 ch"),
        (torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.zeros(3, dtype=torch.long), 2, "one"),
        (torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.zeros(4), 2, "integers"),
        (
            torch.zeros(4, 3, 32, 32, dtype=torch.uint8),
            torch.zeros(4, dtype=torch.long),
            0,
            "batch",
        ),
    ],
)
def test_rejects_bad_inputs(
    images: torch.Tensor, labels: torch.Tensor, batch_size: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        TensorLoader(images, labels, batch_size)
