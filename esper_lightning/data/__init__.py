"""Data: CIFAR-10 and byte-level text, each with its on-disk format and download, a
LightningDataModule and a device-resident loader for the RL environments.

Example:
    >>> import tempfile
    >>> from esper_lightning.data import CIFAR10DataModule, TensorLoader, write_cifar10_fixture
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     root = write_cifar10_fixture(tmp)  # a tiny stand-in; download=True fetches the real one
    ...     dm = CIFAR10DataModule(root, batch_size=16)  # for a Trainer
    ...     loader = TensorLoader.from_cifar10(root, train=True, batch_size=16)  # for the envs
    ...     len(loader), next(iter(loader))[0].shape
    (4, torch.Size([16, 3, 32, 32]))
"""

from __future__ import annotations

from esper_lightning._lazy import lazy_exports

#: Every public name -> its module, imported on first use (PEP 562): the torch-free modules
#: (`files`, `locate`) stay torch-free when imported through this package, so the command line
#: checks a data path, and reads `DataError`, before torch and Lightning load.
_LAZY = {
    **dict.fromkeys(("CIFAR10_MEAN", "CIFAR10_STD", "download_cifar10", "load_cifar10",
                     "load_cifar10_subset"), "esper_lightning.data.cifar10"),
    "CIFAR10DataModule": "esper_lightning.data.datamodule",
    "DataError": "esper_lightning.data.files",
    "default_data_dir": "esper_lightning.data.files",
    "write_cifar10_fixture": "esper_lightning.data.fixture",
    "TensorLoader": "esper_lightning.data.tensor_loader",
    **dict.fromkeys(("HELD_OUT_FRACTION", "find_text_file"), "esper_lightning.data.locate"),
    **dict.fromkeys(("TINYSTORIES_VALID_SHA256", "TINYSTORIES_VALID_URL",
                     "ByteTokenizer", "TextDataModule", "TextSplits", "TextTensorLoader",
                     "download_tinystories", "load_text_tokens", "split_text", "split_tokens",
                     "validation_blocks"), "esper_lightning.data.text"),
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "HELD_OUT_FRACTION",
    "TINYSTORIES_VALID_SHA256",
    "TINYSTORIES_VALID_URL",
    "ByteTokenizer",
    "CIFAR10DataModule",
    "DataError",
    "TensorLoader",
    "TextDataModule",
    "TextSplits",
    "TextTensorLoader",
    "default_data_dir",
    "download_cifar10",
    "download_tinystories",
    "find_text_file",
    "load_cifar10",
    "load_cifar10_subset",
    "load_text_tokens",
    "split_text",
    "split_tokens",
    "validation_blocks",
    "write_cifar10_fixture",
]
