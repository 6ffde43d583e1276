"""CIFAR-10 on disk: the standard ``cifar-10-batches-py`` pickle format, its download, its errors.

Everything that touches the file system lives here so the loaders stay pure tensor code. Bad data
never surfaces as a bare ``KeyError`` or ``UnpicklingError``: it becomes a one-line
:class:`DataError` naming the file or folder and how to fix it.

Example:
    Download from a mirror (here a local archive of the tiny fixture; by default the real 170 MB
    archive, whose training split is ``[50000, 3, 32, 32]``), then load:

    >>> import tarfile
    >>> import tempfile
    >>> from pathlib import Path
    >>> from esper_lightning.data import download_cifar10, load_cifar10, write_cifar10_fixture
    >>> from esper_lightning.data.files import file_digest
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     source = write_cifar10_fixture(Path(tmp) / "source", n_train=50, n_test=10)
    ...     archive = Path(tmp) / "cifar-10-python.tar.gz"
    ...     with tarfile.open(archive, "w:gz") as tar:
    ...         tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    ...     root = download_cifar10(Path(tmp) / "data", url=archive.as_uri(),
    ...                             md5=file_digest(archive, "md5"), progress=False)
    ...     images, labels = load_cifar10(root, train=True)
    ...     images.shape, images.dtype, labels.dtype
    (torch.Size([50, 3, 32, 32]), torch.uint8, torch.int64)
"""

from __future__ import annotations

import os
import pickle
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esper_lightning.data.files import (
    DataError,
    PathLike,
    check_int,
    fetch_verified,
    file_digest,
    make_data_dir,
    one_line,
    resolve_data_dir,
)
from esper_lightning.data.locate import (
    FOLDER_NAME,
    TEST_FILES,
    TRAIN_FILES,
    cifar10_not_found,
    cifar10_present,
    find_batches_dir,
    missing_files,
)

__all__ = [
    "ARCHIVE_NAME",
    "CIFAR10_CLASSES",
    "CIFAR10_MD5",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR10_URL",
    "FOLDER_NAME",
    "PARTS",
    "TEST_FILES",
    "TRAIN_FILES",
    "cifar10_present",
    "download_cifar10",
    "find_batches_dir",
    "held_out_half",
    "load_cifar10",
    "load_cifar10_subset",
    "safe_extract",
    "subset_indices",
]

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE_NAME = "cifar-10-python.tar.gz"
CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
# Per-channel statistics of the 50k training images, in [0, 1] pixel units.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

_IMAGE_SHAPE = (3, 32, 32)
_ROW_BYTES = 3 * 32 * 32


def _corrupt(path: Path, reason: object) -> DataError:
    return DataError(
        f"corrupt CIFAR-10 file '{path}': {one_line(reason)}; delete the folder and download again"
    )


def _unpickle(path: Path) -> dict[Any, Any]:
    try:
        with path.open("rb") as f:
            # Deliberately broad: garbage bytes can raise almost anything from inside pickle.
            batch = pickle.load(f, encoding="bytes")
    except OSError as err:
        raise DataError(f"cannot read CIFAR-10 file '{path}': {one_line(err)}") from err
    except Exception as err:
        raise _corrupt(path, err) from err
    if not isinstance(batch, dict):
        raise _corrupt(path, f"expected a dict, got {type(batch).__name__}")
    return batch


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = _unpickle(path)
    if b"data" not in batch or b"labels" not in batch:
        raise _corrupt(path, "missing b'data' or b'labels' key")
    data, labels = batch[b"data"], batch[b"labels"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        raise _corrupt(path, f"b'data' is not a uint8 array ({type(data).__name__})")
    if data.ndim != 2 or data.shape[1] != _ROW_BYTES:
        raise _corrupt(path, f"b'data' has shape {tuple(data.shape)}, expected (N, {_ROW_BYTES})")
    try:
        label_array = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise _corrupt(path, f"b'labels' is not a list of ints ({one_line(err)})") from err
    if label_array.shape[0] != data.shape[0]:
        raise _corrupt(path, f"{label_array.shape[0]} labels for {data.shape[0]} images")
    if label_array.size and (label_array.min() < 0 or label_array.max() >= len(CIFAR10_CLASSES)):
        raise _corrupt(path, "labels outside 0..9")
    return data, label_array


def load_cifar10(data_dir: PathLike | None, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one CIFAR-10 split into memory.

    Args:
        data_dir: The folder containing ``cifar-10-batches-py/`` or that folder itself; ``None``
            means :func:`default_data_dir`.
        train: ``True`` for the training batches ``data_batch_1..5``, ``False`` for ``test_batch``.

    Returns:
        ``(images, labels)``: uint8 ``[N, 3, 32, 32]`` and int64 ``[N]``, both contiguous CPU
        tensors that own their memory.

    Raises:
        DataError: The folder or a batch file is missing, unreadable or malformed.

    Example:
        >>> import tempfile
        >>> from esper_lightning.data import write_cifar10_fixture
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = write_cifar10_fixture(tmp, n_train=50, n_test=10)
        ...     images, labels = load_cifar10(root, train=False)
        ...     images.shape  # [10000, 3, 32, 32] for the real test split
        torch.Size([10, 3, 32, 32])
    """
    root = resolve_data_dir(data_dir)
    folder = find_batches_dir(root)
    if folder is None:
        raise cifar10_not_found(root)
    parts = [_read_batch(folder / name) for name in (TRAIN_FILES if train else TEST_FILES)]
    # concatenate always copies, so the tensors never alias pickle-owned (possibly read-only) memory
    data = np.concatenate([p[0] for p in parts]).reshape(-1, *_IMAGE_SHAPE)
    labels = np.concatenate([p[1] for p in parts])
    return torch.from_numpy(data), torch.from_numpy(labels)


def subset_indices(total: int, subset: int | None, rng_seed: int) -> torch.Tensor:
    """Indices of the first ``subset`` items after a shuffle seeded with ``rng_seed``, sorted.

    Sorting keeps the kept items in file order, so an unshuffled loader over a subset stays stable.
    ``subset=None`` keeps everything in order.

    Raises:
        ValueError: ``subset`` is not a positive int or exceeds ``total``.
    """
    if subset is None:
        return torch.arange(total)
    check_int("subset", subset, 1, allow_none=True)
    if subset > total:
        raise ValueError(
            f"subset={subset} exceeds the {total} available images; use at most {total}"
        )
    generator = torch.Generator().manual_seed(rng_seed)
    return torch.randperm(total, generator=generator)[:subset].sort().values


#: The parts of CIFAR-10 a run reads: the training batches, and the official test batch cut in
#: two halves, validation first (decisions, tuning, rewards) and test last (final tables only).
PARTS = ("train", "validation", "test")


def held_out_half(count: int, part: str) -> slice:
    """The images of the official test batch (``count`` of them) that ``part`` holds: the first
    half for ``validation``, the rest for ``test``.

    Example:
        >>> held_out_half(846, "validation"), held_out_half(846, "test")
        (slice(0, 423, None), slice(423, 846, None))
    """
    half = count // 2
    if part == "validation":
        return slice(0, half)
    if part == "test":
        return slice(half, count)
    raise ValueError(f"unknown held-out part {part!r}; accepted: validation, test")


def load_cifar10_subset(
    data_dir: PathLike | None,
    part: bool | str,
    subset: int | None = None,
    rng_seed: int = 0,
    *,
    at_most: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one part (`PARTS`: ``"train"``, ``"validation"`` or ``"test"``; ``True`` and
    ``False`` mean the training batches and the whole official test batch) with
    :func:`load_cifar10` and keep ``subset`` images (:func:`subset_indices`; all when None), as
    contiguous uint8 images and int64 labels.

    With ``at_most=True`` a ``subset`` larger than the part keeps the whole part (a preset's
    "up to N images" then runs on a smaller copy of the data too); otherwise it is an error.
    """
    if isinstance(part, str) and part not in PARTS:
        raise ValueError(f"unknown CIFAR-10 part {part!r}; accepted: {', '.join(PARTS)}")
    images, labels = load_cifar10(data_dir, part is True or part == "train")
    if isinstance(part, str) and part != "train":
        keep = held_out_half(len(labels), part)
        images, labels = images[keep].contiguous(), labels[keep].contiguous()
    if subset is None or (at_most and subset >= len(labels)):
        return images, labels
    keep = subset_indices(len(labels), subset, rng_seed)
    return images[keep].contiguous(), labels[keep]


# --------------------------------------------------------------------------------------- download


def _check_member(member: tarfile.TarInfo, archive: Path) -> None:
    name = Path(member.name)
    if name.is_absolute() or ".." in name.parts:
        raise DataError(f"unsafe path '{member.name}' in archive '{archive}'; refusing to extract")
    if not (member.isfile() or member.isdir()):
        raise DataError(
            f"unsupported member '{member.name}' (link or device) in archive '{archive}'; "
            "refusing to extract"
        )


def safe_extract(archive: PathLike, dest: PathLike) -> None:
    """Extract a tar archive, refusing absolute paths, ``..`` components, links and devices.

    Every member is checked before anything is written, so a hostile archive extracts nothing.

    Raises:
        DataError: The archive is unreadable or holds an unsafe member.
    """
    archive, dest = Path(archive), Path(dest)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member, archive)
            # The stdlib "data" filter is a second line of defence where available (3.11.4+).
            kwargs: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, members=members, **kwargs)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DataError(
            f"cannot extract '{archive}': {one_line(err)}; delete it and download again"
        ) from err


def _install_folder(archive: Path, root: Path) -> None:
    """Extract into a hidden temp dir, validate, then move ``cifar-10-batches-py`` into place."""
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".cifar-10-extract."))
    try:
        safe_extract(archive, staging)
        extracted = staging / FOLDER_NAME
        missing = missing_files(extracted) if extracted.is_dir() else [FOLDER_NAME]
        if missing:
            raise DataError(
                f"archive '{archive}' lacks {', '.join(missing)}; delete it and download again"
            )
        try:
            # A directory rename is atomic: the target is either absent or complete.
            os.replace(extracted, root / FOLDER_NAME)
        except OSError as err:
            # Another process may have finished first; its copy is as good as ours.
            if not cifar10_present(root):
                raise DataError(f"cannot move CIFAR-10 into '{root}': {one_line(err)}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def download_cifar10(
    data_dir: PathLike | None = None,
    url: str = CIFAR10_URL,
    md5: str = CIFAR10_MD5,
    progress: bool = True,
) -> Path:
    """Download and extract CIFAR-10 into ``data_dir`` unless a complete copy is already there.

    The archive is streamed to a temporary file, verified against ``md5``, renamed to
    ``cifar-10-python.tar.gz`` (kept, so a deleted folder re-extracts without a download),
    extracted into a hidden staging folder and only then renamed to ``cifar-10-batches-py``. An
    interrupted or failed download therefore never leaves a folder that looks valid.

    Args:
        data_dir: Destination (the folder that will contain ``cifar-10-batches-py/``); ``None``
            means :func:`default_data_dir`. Passing ``.../cifar-10-batches-py`` itself also works.
        url: Where to fetch the ``.tar.gz`` from (any ``urllib`` URL, e.g. a local mirror).
        md5: Expected hex MD5 of the archive.
        progress: Show a tqdm progress bar.

    Returns:
        The folder containing ``cifar-10-batches-py/``, ready for :func:`load_cifar10`.

    Raises:
        DataError: Network failure, MD5 mismatch, unsafe or incomplete archive, or an incomplete
            ``cifar-10-batches-py`` folder already in the way.

    Example:
        >>> root = download_cifar10("~/data", progress=False)  # doctest: +SKIP

        The module docs run it against a local mirror.
    """
    root = resolve_data_dir(data_dir)
    if root.name == FOLDER_NAME and not (root / FOLDER_NAME).exists():
        root = root.parent
    if cifar10_present(root):
        return root
    if (root / FOLDER_NAME).exists():
        missing = ", ".join(missing_files(root / FOLDER_NAME))
        raise DataError(
            f"'{root / FOLDER_NAME}' exists but is incomplete (missing {missing}); delete it and "
            "download again"
        )
    archive = make_data_dir(root) / ARCHIVE_NAME
    # A previous run's verified archive saves the download; a bad one is simply replaced.
    if not (archive.is_file() and file_digest(archive, "md5") == md5):
        # The archive itself is an offline copy too: a verified one there skips the download.
        hint = (
            f"put {ARCHIVE_NAME} in '{root}', or point --data-dir / ESPER_DATA_DIR at an "
            "offline copy"
        )
        fetch_verified(url, archive, md5, "md5", progress, hint=hint)
    _install_folder(archive, root)
    return root
