"""On-disk format, errors, download and safe extraction of CIFAR-10."""

from __future__ import annotations

import hashlib
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import one_line_message

from esper_lightning.data import (
    DataError,
    default_data_dir,
    download_cifar10,
    load_cifar10,
    write_cifar10_fixture,
)
from esper_lightning.data.cifar10 import (
    ARCHIVE_NAME,
    FOLDER_NAME,
    cifar10_present,
    safe_extract,
    subset_indices,
)

# ------------------------------------------------------------------------------------ format


def test_fixture_round_trip(cifar_dir: Path) -> None:
    images, labels = load_cifar10(cifar_dir, train=True)
    assert images.shape == (80, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.shape == (80,) and labels.dtype == torch.int64
    assert torch.equal(labels.bincount(minlength=10), torch.full((10,), 8))
    test_images, test_labels = load_cifar10(cifar_dir, train=False)
    assert test_images.shape == (40, 3, 32, 32) and test_labels.shape == (40,)


def test_fixture_matches_real_layout(cifar_dir: Path) -> None:
    folder = cifar_dir / FOLDER_NAME
    with (folder / "data_batch_1").open("rb") as f:
        batch = pickle.load(f, encoding="bytes")
    assert set(batch) == {b"data", b"labels", b"batch_label", b"filenames"}
    assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (16, 3072)
    assert batch[b"batch_label"] == b"training batch 1 of 5"
    with (folder / "batches.meta").open("rb") as f:
        meta = pickle.load(f, encoding="bytes")
    assert meta[b"label_names"][0] == b"airplane"


def test_fixture_is_deterministic_and_class_separable(tmp_path: Path) -> None:
    a = load_cifar10(write_cifar10_fixture(tmp_path / "a", rng_seed=3), train=True)
    b = load_cifar10(write_cifar10_fixture(tmp_path / "b", rng_seed=3), train=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # Class mean colours must differ by far more than the noise of a per-class mean.
    images, labels = a[0].float(), a[1]
    means = torch.stack([images[labels == c].mean(dim=(0, 2, 3)) for c in range(10)])
    gaps = torch.cdist(means, means) + torch.eye(10) * 1e9
    assert gaps.min() > 20


def test_accepts_the_batches_folder_itself(cifar_dir: Path) -> None:
    images, _ = load_cifar10(cifar_dir / FOLDER_NAME, train=False)
    assert images.shape[0] == 40


def test_missing_folder_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError) as err:
        load_cifar10(missing, train=True)
    message = one_line_message(err)
    assert f"'{missing}'" in message and "download=True" in message and "--data-dir" in message


def test_partial_folder_lists_missing_files(cifar_dir: Path) -> None:
    (cifar_dir / FOLDER_NAME / "data_batch_4").unlink()
    with pytest.raises(DataError, match="missing data_batch_4"):
        load_cifar10(cifar_dir, train=True)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00garbage\xff" * 50,
        b"",
        "truncated",
        {b"data": np.zeros((4, 100), np.uint8), b"labels": [0, 1, 2, 3]},
        {b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1]},
        {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]},
        {b"labels": [0]},
        [1, 2, 3],
    ],
    ids=["garbage", "empty", "truncated", "shape", "count", "range", "no-data", "not-dict"],
)
def test_corrupt_file_names_it(cifar_dir: Path, payload: object) -> None:
    path = cifar_dir / FOLDER_NAME / "data_batch_2"
    if payload == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif isinstance(payload, bytes):
        path.write_bytes(payload)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(DataError) as err:
        load_cifar10(cifar_dir, train=True)
    message = one_line_message(err)
    assert message.startswith(f"corrupt CIFAR-10 file '{path}': ")
    assert "download again" in message
    # The test split lives in another file and is unaffected.
    assert load_cifar10(cifar_dir, train=False)[0].shape[0] == 40


def test_default_data_dir_respects_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ESPER_DATA_DIR", str(tmp_path / "env"))
    assert default_data_dir() == tmp_path / "env"
    monkeypatch.delenv("ESPER_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / ".cache" / "esper_lightning" / "data"


def test_none_data_dir_uses_env(monkeypatch: pytest.MonkeyPatch, cifar_dir: Path) -> None:
    monkeypatch.setenv("ESPER_DATA_DIR", str(cifar_dir))
    assert load_cifar10(None, train=False)[0].shape[0] == 40


def test_subset_indices_seeded_sorted_and_validated() -> None:
    first = subset_indices(100, 10, rng_seed=1)
    assert torch.equal(first, subset_indices(100, 10, rng_seed=1))
    assert not torch.equal(first, subset_indices(100, 10, rng_seed=2))
    assert torch.equal(first, first.sort().values) and len(first.unique()) == 10
    assert torch.equal(subset_indices(5, None, rng_seed=0), torch.arange(5))
    for bad in (0, -1, 101, 2.5, True):
        with pytest.raises(ValueError, match="subset"):
            subset_indices(100, bad, rng_seed=0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- download


def _make_archive(source_root: Path, dest: Path) -> str:
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(source_root / FOLDER_NAME, arcname=FOLDER_NAME)
    return hashlib.md5(dest.read_bytes()).hexdigest()


@pytest.fixture
def served(tmp_path: Path, cifar_dir: Path, serve_folder) -> tuple[str, str]:
    """Serve a fixture ``cifar-10-python.tar.gz`` on 127.0.0.1; returns ``(url, md5)``."""
    www = tmp_path / "www"
    www.mkdir()
    md5 = _make_archive(cifar_dir, www / ARCHIVE_NAME)
    return f"{serve_folder(www)}/{ARCHIVE_NAME}", md5


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_download_extracts_and_loads(served: tuple[str, str], tmp_path: Path) -> None:
    url, md5 = served
    dest = tmp_path / "dl"
    root = download_cifar10(dest, url=url, md5=md5, progress=False)
    assert root == dest
    assert _visible(dest) == sorted([ARCHIVE_NAME, FOLDER_NAME])
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]  # no temp leftovers
    assert load_cifar10(dest, train=True)[0].shape == (80, 3, 32, 32)


def test_download_is_skipped_when_present_or_archive_valid(
    served: tuple[str, str], tmp_path: Path
) -> None:
    url, md5 = served
    dest = download_cifar10(tmp_path / "dl", url=url, md5=md5, progress=False)
    dead_url = "http://127.0.0.1:9/nothing.tar.gz"
    assert download_cifar10(dest, url=dead_url, md5=md5, progress=False) == dest
    # With the folder gone, a valid archive is re-extracted without touching the network.
    for path in (dest / FOLDER_NAME).iterdir():
        path.unlink()
    (dest / FOLDER_NAME).rmdir()
    download_cifar10(dest, url=dead_url, md5=md5, progress=False)
    assert cifar10_present(dest)


def test_download_md5_mismatch_leaves_nothing_valid(
    served: tuple[str, str], tmp_path: Path
) -> None:
    url, _ = served
    dest = tmp_path / "dl"
    wrong = "0" * 32
    with pytest.raises(DataError) as err:
        download_cifar10(dest, url=url, md5=wrong, progress=False)
    message = one_line_message(err)
    assert "MD5 mismatch" in message and wrong in message and str(dest / ARCHIVE_NAME) in message
    assert list(dest.iterdir()) == []
    assert not cifar10_present(dest)


def test_download_network_error_is_one_line(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9/cifar-10-python.tar.gz"  # discard port: connection refused
    with pytest.raises(DataError) as err:
        download_cifar10(tmp_path / "dl", url=url, progress=False)
    message = one_line_message(err)
    assert url in message and "--data-dir" in message
    assert list((tmp_path / "dl").iterdir()) == []


def test_download_http_404(served: tuple[str, str], tmp_path: Path) -> None:
    url, md5 = served
    with pytest.raises(DataError, match="could not download"):
        download_cifar10(tmp_path / "dl", url=url + ".missing", md5=md5, progress=False)


def test_download_refuses_incomplete_existing_folder(tmp_path: Path) -> None:
    (tmp_path / FOLDER_NAME).mkdir()
    with pytest.raises(DataError, match="incomplete"):
        download_cifar10(tmp_path, url="http://127.0.0.1:9/x", progress=False)


def _tar_with(dest: Path, name: str, data: bytes = b"evil") -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return dest


@pytest.mark.parametrize("member", ["../evil", "ok/../../evil", "/tmp/evil"])
def test_safe_extract_rejects_escaping_members(tmp_path: Path, member: str) -> None:
    archive = _tar_with(tmp_path / "bad.tar.gz", member)
    out = tmp_path / "out" / "inner"
    out.mkdir(parents=True)
    with pytest.raises(DataError, match="unsafe path"):
        safe_extract(archive, out)
    assert not (tmp_path / "out" / "evil").exists() and list(out.iterdir()) == []


def test_safe_extract_rejects_links(tmp_path: Path) -> None:
    archive = tmp_path / "link.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("cifar-10-batches-py/link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(DataError, match="link or device"):
        safe_extract(archive, tmp_path / "out")


def test_corrupt_archive_is_a_data_error(tmp_path: Path) -> None:
    archive = tmp_path / "broken.tar.gz"
    archive.write_bytes(b"not a tarball")
    with pytest.raises(DataError, match="cannot extract"):
        safe_extract(archive, tmp_path / "out")


def test_incomplete_archive_leaves_nothing_valid(cifar_dir: Path, tmp_path: Path) -> None:
    (cifar_dir / FOLDER_NAME / "test_batch").unlink()
    archive = tmp_path / ARCHIVE_NAME
    md5 = _make_archive(cifar_dir, archive)
    dest = tmp_path / "dl"
    with pytest.raises(DataError, match="lacks test_batch"):
        download_cifar10(dest, url=archive.as_uri(), md5=md5, progress=False)
    assert _visible(dest) == [ARCHIVE_NAME] and not cifar10_present(dest)


def test_fixture_is_learnable_by_a_tiny_cnn(cifar_dir: Path) -> None:
    torch.manual_seed(0)
    x, y = load_cifar10(cifar_dir, train=True)
    x_test, y_test = load_cifar10(cifar_dir, train=False)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(128, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):
        for batch in torch.randperm(len(y)).split(16):
            loss = torch.nn.functional.cross_entropy(model(x[batch].float() / 255), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    accuracy = (model(x_test.float() / 255).argmax(1) == y_test).float().mean()
    assert accuracy > 0.3  # chance is 0.1
