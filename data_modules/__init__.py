"""LightningDataModules (DESIGN §4): the embedded stdlib corpus, Hugging Face datasets, the token-stream base every
corpus shares, and the synthetic tasks (offset copy, passkey retrieval)."""

from accrot.errors import DataError
from data_modules.hf import HFDataModule
from data_modules.stdlib import StdlibDataModule, stdlib_root
from data_modules.streams import TokenStreamDataModule, TokenStreams, TokenWindows
from data_modules.synthetic import LocalDependencyDataModule, PasskeyDataModule, SyntheticDataModule
from data_modules.tokenizer import ByteTokenizer, Tokenizer

__all__ = [
    "ByteTokenizer",
    "DataError",
    "HFDataModule",
    "LocalDependencyDataModule",
    "PasskeyDataModule",
    "StdlibDataModule",
    "SyntheticDataModule",
    "TokenStreamDataModule",
    "TokenStreams",
    "TokenWindows",
    "Tokenizer",
    "stdlib_root",
]
