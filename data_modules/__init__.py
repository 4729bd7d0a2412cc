"""LightningDataModules (DESIGN §4): the embedded stdlib corpus and the token-stream base every corpus shares."""

from data_modules.errors import DataError
from data_modules.stdlib import StdlibDataModule, stdlib_root
from data_modules.streams import TokenStreamDataModule, TokenStreams, TokenWindows
from data_modules.tokenizer import ByteTokenizer, Tokenizer

__all__ = [
    "ByteTokenizer",
    "DataError",
    "StdlibDataModule",
    "TokenStreamDataModule",
    "TokenStreams",
    "TokenWindows",
    "Tokenizer",
    "stdlib_root",
]
