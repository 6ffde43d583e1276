"""Shared pytest fixtures."""

from __future__ import annotations

import functools
import hashlib
import http.server
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from esper_lightning.blueprints import blueprint_table, scratch_registry
from esper_lightning.blueprints.growth import scratch_operators
from esper_lightning.data import write_cifar10_fixture

#: Test files whose tests run the product whole: command-line processes, fresh interpreters,
#: the examples and documented recipes, DDP ranks, studies and comparisons end to end. Marked
#: ``integration`` here, in one place: ``pytest -m "not integration"`` is the quick unit suite,
#: ``pytest`` (and CI) runs both.
INTEGRATION_FILES = frozenset({
    "test_app_budget.py", "test_app_cli.py", "test_app_compare_runner.py",
    "test_app_compare_runner_budget.py", "test_app_console.py", "test_app_ppo_distributed.py",
    "test_app_ppo_trainer.py", "test_app_startup.py", "test_callbacks_distributed.py",
    "test_docs_recipes.py", "test_examples_cifar_callback.py", "test_examples_grow_gpt.py",
    "test_examples_lm_callback.py", "test_extend_controller.py",
    "test_scripts_controller_study.py", "test_scripts_short_run_study.py", "test_shipped.py",
})


def pytest_configure(config: pytest.Config) -> None:
    # The test models are tiny: a second intra-op thread buys nothing, and on a busy 2-core
    # machine OpenMP spin-waiting between two processes slows them down by orders of magnitude.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in INTEGRATION_FILES:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _blueprint_table_untouched() -> Iterator[None]:
    """Fail a test that leaves a blueprint in the table (the table only grows, and its length
    sizes every policy created later): register inside `scratch_registry`. The registry is put
    back either way, so the other tests run as in any order."""
    before = blueprint_table()
    with scratch_registry(), scratch_operators():
        yield
        after = blueprint_table()
    assert after == before, f"the test left blueprints {after[len(before):]} in the table"


def folder_checksums(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by relative path, with its SHA-256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def _cifar_master(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture folder written once per session (per xdist worker); only copied from."""
    return write_cifar10_fixture(tmp_path_factory.mktemp("cifar_master") / "cifar", n_train=80,
                                 n_test=40, rng_seed=0)


@pytest.fixture
def cifar_dir(tmp_path: Path, _cifar_master: Path) -> Path:
    """A tiny learnable CIFAR-10 (80 train / 40 test) in the standard format; the folder that
    contains ``cifar-10-batches-py/``. The test's own copy in ``tmp_path/cifar`` (it may change
    or delete files), of the files `write_cifar10_fixture` writes once per session."""
    return Path(shutil.copytree(_cifar_master, tmp_path / "cifar"))


@pytest.fixture(scope="session")
def smoke_policy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """``(data folder, checkpoint)`` of a one-round PPO policy (``smoke`` preset, episodes of 3
    epochs, slots r0c1 r0c2 of the baseline host), trained once per session (per xdist worker)
    by the README's quickstart, shortened (`helpers.train_smoke_policy`); its TensorBoard run
    beside the checkpoint in ``logs/``. Shared, so read-only: a test that changes the checkpoint
    or the data copies them into its own ``tmp_path`` first; the session fails at teardown if
    a file in the folder changed."""
    from helpers import train_smoke_policy

    data, save = train_smoke_policy(tmp_path_factory.mktemp("smoke_policy"))
    before = folder_checksums(data), save.read_bytes()
    yield data, save
    after = folder_checksums(data), save.read_bytes()
    assert after == before, "a test changed the shared smoke policy or its data"


_WORDS = ("the", "king", "queen", "speaks", "to", "his", "her", "lord", "and", "lady", "of",
          "france", "with", "love", "war", "my", "good", "sir")


@pytest.fixture(scope="session")
def _text_master(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`text_file`'s text written once per session (per xdist worker); only copied from."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."
             for _ in range(600)]
    path = tmp_path_factory.mktemp("text_master") / "plays.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def text_file(tmp_path: Path, _text_master: Path) -> Path:
    """A small learnable text in ``tmp_path/text/plays.txt``: 600 seeded pseudo-sentences of
    4 to 9 words (about 19 KB, so each half of its 10% held-out tail, validation and test, holds
    29 blocks of 32 tokens). The test's own copy of the text `_text_master` wrote."""
    path = tmp_path / "text" / "plays.txt"
    path.parent.mkdir()
    shutil.copyfile(_text_master, path)
    return path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def serve_folder() -> Iterator[Callable[[Path], str]]:
    """Serve folders over HTTP on 127.0.0.1 for download tests: ``serve_folder(path)`` returns
    the base URL (``http://127.0.0.1:<port>``); every server stops at the end of the test."""
    servers: list[tuple[http.server.ThreadingHTTPServer, threading.Thread]] = []

    def serve(folder: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
        thread.daemon = True
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_port}"

    yield serve
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
