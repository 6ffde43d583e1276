"""The file-system and network layer under every dataset: the data folder, verified downloads,
one-line errors and the argument and state checks the data modules share.

Each dataset module (CIFAR-10, byte-level text) keeps only what is its own: file names, URLs,
digests and the hint that tells a user how to provide the data offline.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from esper_lightning.data.files import fetch_verified, file_digest, make_data_dir
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     source = Path(tmp) / "a.txt"  # a local file stands in for a server
    ...     _ = source.write_text("payload")
    ...     root = make_data_dir(Path(tmp) / "data")  # a dataset passes resolve_data_dir(...)
    ...     fetch_verified(source.as_uri(), root / "a.txt", file_digest(source, "sha256"),
    ...                    "sha256", progress=False, hint="put a.txt in that folder")
    ...     (root / "a.txt").read_text()
    'payload'
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

from tqdm.auto import tqdm

__all__ = [
    "DataError",
    "PathLike",
    "check_bool",
    "check_int",
    "default_data_dir",
    "fetch_verified",
    "file_digest",
    "make_data_dir",
    "one_line",
    "require_setup",
    "resolve_data_dir",
]

PathLike = str | os.PathLike[str]
_T = TypeVar("_T")

_CHUNK_BYTES = 1 << 20
_TIMEOUT_S = 60.0
_MAX_REASON_CHARS = 120
# The digests a dataset may be checked with, by hashlib name, and how a message spells them.
_DIGEST_LABELS = {"md5": "MD5", "sha256": "SHA-256"}
# What a failed transfer raises; anything else that is an OSError is a local write failure.
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError)


class DataError(RuntimeError):
    """Dataset files are missing, corrupt, or could not be downloaded.

    The message is always a single line that names the folder, file or URL involved and says how
    to fix it, so a CLI can print it without a traceback.

    Example:
        >>> from esper_lightning.data import load_cifar10
        >>> try:
        ...     load_cifar10("/nowhere", train=True)
        ... except DataError as err:
        ...     print(err)  # doctest: +ELLIPSIS
        CIFAR-10 not found in '/nowhere': expected cifar-10-batches-py/ ...; pass download=True ...
    """


class _Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def default_data_dir() -> Path:
    """Return ``$ESPER_DATA_DIR`` if set, else ``~/.cache/esper_lightning/data`` (expanded).

    Example:
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"ESPER_DATA_DIR": "~/datasets"}):
        ...     default_data_dir() == Path.home() / "datasets"
        True
    """
    env = os.environ.get("ESPER_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/esper_lightning/data").expanduser()


def resolve_data_dir(data_dir: PathLike | None) -> Path:
    """The data folder a user asked for: ``data_dir`` expanded, or :func:`default_data_dir`.

    Example:
        >>> resolve_data_dir("~/data") == Path.home() / "data"
        True
    """
    return default_data_dir() if data_dir is None else Path(data_dir).expanduser()


def make_data_dir(folder: Path) -> Path:
    """Create ``folder`` (and its parents) if needed and return it.

    Raises:
        DataError: The folder cannot be created.

    Example:
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     make_data_dir(Path(tmp) / "a" / "b").is_dir()
        True
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"cannot create data folder '{folder}': {one_line(err)}") from err
    return folder


def one_line(reason: object) -> str:
    """``reason`` as one short line, for the tail of a :class:`DataError` message.

    Exception texts can span lines (pickle, HTTP bodies, OS errors) and a ``DataError`` must stay
    one line, so white space is folded, an exception is prefixed with its type name and the text
    is cut to 120 characters.

    Example:
        >>> one_line(OSError("disk\\nfull"))
        'OSError: disk full'
    """
    text = " ".join(str(reason).split())
    if isinstance(reason, BaseException):
        text = f"{type(reason).__name__}: {text}" if text else type(reason).__name__
    if len(text) > _MAX_REASON_CHARS:
        text = text[: _MAX_REASON_CHARS - 3] + "..."
    return text


def _new_hash(algorithm: str) -> _Hash:
    if algorithm not in _DIGEST_LABELS:
        raise ValueError(f"algorithm must be one of {sorted(_DIGEST_LABELS)}, got {algorithm!r}")
    if algorithm == "md5":
        # MD5 only checks that an archive arrived intact; FIPS builds allow it when told so.
        return hashlib.md5(usedforsecurity=False)
    return hashlib.sha256()


def file_digest(path: Path, algorithm: str) -> str:
    """Hex digest of a file's bytes, read in 1 MiB chunks.

    Args:
        path: The file.
        algorithm: ``"md5"`` or ``"sha256"``.

    Raises:
        ValueError: ``algorithm`` is neither.

    Example:
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     (Path(tmp) / "empty.txt").touch()
        ...     file_digest(Path(tmp) / "empty.txt", "md5")
        'd41d8cd98f00b204e9800998ecf8427e'
    """
    digest = _new_hash(algorithm)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stream(url: str, out: BinaryIO, digest: _Hash, name: str, progress: bool) -> str:
    """Copy ``url`` into ``out`` chunk by chunk under a progress bar; return the hex digest."""
    with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
        size = response.headers.get("Content-Length")
        total = int(size) if size and size.isdigit() else None
        with tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=name,
            disable=not progress,
        ) as bar:
            for chunk in iter(lambda: response.read(_CHUNK_BYTES), b""):
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    return digest.hexdigest()


def _temp_file(target: Path, hint: str) -> tuple[int, Path]:
    """A hidden ``.part`` file beside ``target``, so the final rename stays on one file system."""
    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    except OSError as err:
        raise DataError(
            f"cannot write to data folder '{target.parent}': {one_line(err)}; pick a writable "
            f"folder, or {hint}"
        ) from err
    return fd, Path(name)


def fetch_verified(
    url: str, target: Path, digest: str, algorithm: str, progress: bool, *, hint: str
) -> None:
    """Download ``url`` to ``target`` through a temp file, so ``target`` is verified or absent.

    The bytes go to a hidden temp file in ``target``'s folder under a tqdm bar, are checked
    against ``digest`` and only then renamed onto ``target``; the temp file never outlives a call.

    Args:
        url: Any ``urllib`` URL (``https://``, ``file://``, a local mirror).
        target: Final path of the file; its folder must exist.
        digest: Expected hex digest of the file.
        algorithm: ``"md5"`` or ``"sha256"``.
        progress: Show a tqdm progress bar.
        hint: How to provide the file without a download, as a clause that can follow "or"
            (e.g. ``"pass path= pointing at a local copy"``); every error message ends with it.

    Raises:
        DataError: Network failure, digest mismatch or an unwritable folder; one line each.
        ValueError: ``algorithm`` is not ``"md5"`` or ``"sha256"``.

    Example:
        A download whose digest does not match leaves nothing behind (the module docs show one
        that does):

        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     source = Path(tmp) / "a.txt"  # a local file stands in for a server
        ...     _ = source.write_text("payload")
        ...     try:
        ...         fetch_verified(source.as_uri(), Path(tmp) / "b.txt", "0" * 64, "sha256",
        ...                        progress=False, hint="put b.txt in that folder")
        ...     except DataError as err:
        ...         print(err)  # doctest: +ELLIPSIS
        ...     sorted(p.name for p in Path(tmp).iterdir())
        SHA-256 mismatch for '.../b.txt' downloaded from 'file://.../a.txt': ... in that folder
        ['a.txt']
    """
    hasher = _new_hash(algorithm)
    fd, tmp = _temp_file(target, hint)
    try:
        with os.fdopen(fd, "wb") as out:
            actual = _stream(url, out, hasher, target.name, progress)
        if actual != digest:
            raise DataError(
                f"{_DIGEST_LABELS[algorithm]} mismatch for '{target}' downloaded from '{url}': "
                f"expected {digest}, got {actual}; the download is corrupt or the URL is wrong, "
                f"try again or {hint}"
            )
        os.replace(tmp, target)
    except _NETWORK_ERRORS as err:
        raise DataError(
            f"could not download '{url}': {one_line(err)}; check the network, or {hint}"
        ) from err
    except OSError as err:
        raise DataError(f"could not write '{target}': {one_line(err)}; {hint}") from err
    finally:
        tmp.unlink(missing_ok=True)


def check_int(name: str, value: object, minimum: int, allow_none: bool = False) -> None:
    """Raise a one-line ``ValueError`` unless ``value`` is an int >= ``minimum`` (or allowed None).

    ``bool`` is refused although it is an ``int`` subclass: ``batch_size=True`` is a mistake.

    Example:
        >>> check_int("batch_size", 0, 1)
        Traceback (most recent call last):
        ValueError: batch_size must be an int >= 1, got 0
    """
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        accepted = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {accepted}, got {value!r}")


def check_bool(name: str, value: object) -> None:
    """Raise a one-line ``ValueError`` unless ``value`` is ``True`` or ``False``.

    Example:
        >>> check_bool("download", "yes")
        Traceback (most recent call last):
        ValueError: download must be True or False, got 'yes'
    """
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def require_setup(value: _T | None, caller: str) -> _T:
    """``value`` (what a data module's ``setup`` loads), or a ``RuntimeError`` naming ``caller``
    when ``setup`` has not run yet.

    Example:
        >>> require_setup(None, "train_dataloader")
        Traceback (most recent call last):
        RuntimeError: call setup() before train_dataloader()
    """
    if value is None:
        raise RuntimeError(f"call setup() before {caller}()")
    return value
