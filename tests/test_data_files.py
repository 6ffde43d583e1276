"""The data folder, digests, verified downloads, one-line errors and argument checks."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from helpers import one_line_message

from esper_lightning.data import DataError as PackageDataError
from esper_lightning.data.files import (
    DataError,
    check_bool,
    check_int,
    default_data_dir,
    fetch_verified,
    file_digest,
    make_data_dir,
    one_line,
    require_setup,
    resolve_data_dir,
)

HINT = "put a.txt in that folder by hand"
PAYLOAD = b"a verified payload\n" * 100


def _message(err: pytest.ExceptionInfo[DataError]) -> str:
    message = one_line_message(err)
    assert message.endswith(HINT)
    return message


def test_data_error_is_one_class_everywhere() -> None:
    assert PackageDataError is DataError
    assert issubclass(DataError, RuntimeError)


# ---------------------------------------------------------------------------------- one_line


def test_one_line_folds_white_space_and_names_the_exception() -> None:
    assert one_line("a\n  b\tc\n") == "a b c"
    assert one_line(OSError("disk\nfull")) == "OSError: disk full"
    assert one_line(KeyError()) == "KeyError"


def test_one_line_cuts_long_reasons_to_120_characters() -> None:
    text = one_line("x" * 500)
    assert len(text) == 120 and text == "x" * 117 + "..."
    assert one_line("y" * 120) == "y" * 120


# ------------------------------------------------------------------------------ data folder


def test_resolve_data_dir_expands_or_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("ESPER_DATA_DIR", raising=False)
    assert resolve_data_dir("~/d") == tmp_path / "d"
    assert resolve_data_dir(None) == tmp_path / ".cache/esper_lightning/data"
    monkeypatch.setenv("ESPER_DATA_DIR", "~/env")
    assert resolve_data_dir(None) == default_data_dir() == tmp_path / "env"


def test_make_data_dir_creates_parents_and_reports_failure(tmp_path: Path) -> None:
    folder = make_data_dir(tmp_path / "a" / "b")
    assert folder.is_dir() and make_data_dir(folder) == folder  # idempotent
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(DataError, match=r"cannot create data folder .*file/sub"):
        make_data_dir(blocker / "sub")


# ----------------------------------------------------------------------------------- digests


def test_file_digest_of_known_bytes(tmp_path: Path) -> None:
    path = tmp_path / "abc.txt"
    path.write_bytes(b"abc")
    assert file_digest(path, "md5") == "900150983cd24fb0d6963f7d28e17f72"
    assert file_digest(path, "sha256") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


def test_file_digest_spans_chunks(tmp_path: Path) -> None:
    data = bytes(range(256)) * (5 * 4096 + 7)  # ~5 MiB: several 1 MiB chunks and a tail
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    assert file_digest(path, "sha256") == hashlib.sha256(data).hexdigest()


def test_file_digest_refuses_other_algorithms(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="algorithm must be one of \\['md5', 'sha256'\\]"):
        file_digest(tmp_path / "never-read", "sha1")


# --------------------------------------------------------------------------- fetch_verified


@pytest.fixture
def url(tmp_path: Path, serve_folder) -> str:
    """URL of ``PAYLOAD`` served from 127.0.0.1."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "a.txt").write_bytes(PAYLOAD)
    return f"{serve_folder(www)}/a.txt"


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    return make_data_dir(tmp_path / "dest")


@pytest.mark.parametrize("algorithm", ["md5", "sha256"])
def test_fetch_verified_writes_the_checked_file_only(url: str, dest: Path, algorithm: str) -> None:
    digest = hashlib.new(algorithm, PAYLOAD).hexdigest()
    fetch_verified(url, dest / "a.txt", digest, algorithm, False, hint=HINT)
    assert (dest / "a.txt").read_bytes() == PAYLOAD
    assert [p.name for p in dest.iterdir()] == ["a.txt"]  # no temp leftovers


@pytest.mark.parametrize(("algorithm", "label"), [("md5", "MD5"), ("sha256", "SHA-256")])
def test_fetch_verified_mismatch_keeps_the_old_file(
    url: str, dest: Path, algorithm: str, label: str
) -> None:
    target = dest / "a.txt"
    target.write_bytes(b"old")
    wrong = "0" * len(hashlib.new(algorithm).hexdigest())
    with pytest.raises(DataError) as err:
        fetch_verified(url, target, wrong, algorithm, False, hint=HINT)
    message = _message(err)
    assert message.startswith(f"{label} mismatch for '{target}' downloaded from '{url}'")
    assert f"expected {wrong}, got {hashlib.new(algorithm, PAYLOAD).hexdigest()}" in message
    assert target.read_bytes() == b"old" and [p.name for p in dest.iterdir()] == ["a.txt"]


def test_fetch_verified_unwritable_folder(url: str, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_bytes(b"")
    with pytest.raises(DataError) as err:
        fetch_verified(url, blocker / "a.txt", "0" * 64, "sha256", False, hint=HINT)
    assert _message(err).startswith(f"cannot write to data folder '{blocker}'")


def test_fetch_verified_target_in_the_way(url: str, dest: Path) -> None:
    (dest / "a.txt").mkdir()  # a folder where the file should go: the rename fails
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    with pytest.raises(DataError) as err:
        fetch_verified(url, dest / "a.txt", digest, "sha256", False, hint=HINT)
    assert _message(err).startswith(f"could not write '{dest / 'a.txt'}'")
    assert [p.name for p in dest.iterdir()] == ["a.txt"]


@pytest.mark.parametrize("where", ["missing", "refused"])
def test_fetch_verified_network_errors(url: str, dest: Path, where: str) -> None:
    # A 404 from the local server, or the discard port where nothing listens.
    bad = url + ".missing" if where == "missing" else "http://127.0.0.1:9/a.txt"
    with pytest.raises(DataError) as err:
        fetch_verified(bad, dest / "a.txt", "0" * 64, "sha256", False, hint=HINT)
    message = _message(err)
    assert message.startswith(f"could not download '{bad}': ") and "check the network" in message
    assert list(dest.iterdir()) == []


def test_fetch_verified_refuses_other_algorithms_before_writing(dest: Path) -> None:
    with pytest.raises(ValueError, match="algorithm"):
        fetch_verified("http://127.0.0.1:9/a.txt", dest / "a.txt", "0", "crc32", False, hint=HINT)
    assert list(dest.iterdir()) == []


# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    ("value", "allow_none", "message"),
    [
        (0, False, "n must be an int >= 1, got 0"),
        (True, False, "n must be an int >= 1, got True"),
        (2.0, False, "n must be an int >= 1, got 2.0"),
        (None, False, "n must be an int >= 1, got None"),
        ("3", True, "n must be an int >= 1 or None, got '3'"),
    ],
)
def test_check_int_rejects(value: object, allow_none: bool, message: str) -> None:
    with pytest.raises(ValueError) as err:
        check_int("n", value, 1, allow_none=allow_none)
    assert str(err.value) == message


def test_check_int_and_check_bool_accept() -> None:
    check_int("n", 1, 1)
    check_int("n", 0, 0)
    check_int("n", None, 1, allow_none=True)
    check_bool("flag", True)
    check_bool("flag", False)


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_check_bool_rejects(value: object) -> None:
    with pytest.raises(ValueError) as err:
        check_bool("flag", value)
    assert str(err.value) == f"flag must be True or False, got {value!r}"


def test_require_setup_passes_what_setup_loaded_and_names_the_caller_otherwise() -> None:
    loaded = object()
    assert require_setup(loaded, "train_dataloader") is loaded
    with pytest.raises(RuntimeError) as err:
        require_setup(None, "val_dataloader")
    assert str(err.value) == "call setup() before val_dataloader()"
