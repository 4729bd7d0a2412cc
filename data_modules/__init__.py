"""LightningDataModules: the embedded stdlib corpus, Hugging Face datasets, the token-stream base every
corpus shares, prose (the King James Bible from Debian's bible-kjv), the synthetic tasks (offset copy, passkey
retrieval), the RULER-style retrieval tasks (multi-key needles, multi-value needles, variable tracking) and the
state-tracking tasks (flip-flop, parity and counting mod n, S5/A5 word problems, N-back recall), the formal languages
of separate examples (parity, modular arithmetic with and without brackets, with a length curriculum); what the pipeline
asks of each (:class:`Task`, :class:`AnswerTask`)."""

from accrot.errors import DataError
from data_modules.formal import FormalLanguageDataModule
from data_modules.hf import HFDataModule
from data_modules.prose import KJVDataModule
from data_modules.retrieval import MultiKeyNeedleDataModule, MultiValueDataModule, VariableTrackingDataModule
from data_modules.state import FlipFlopDataModule, ModCountDataModule, NBackDataModule, WordProblemDataModule
from data_modules.stdlib import StdlibDataModule, stdlib_root
from data_modules.streams import TokenStreamDataModule, TokenStreams, TokenWindows
from data_modules.synthetic import LocalDependencyDataModule, PasskeyDataModule, SyntheticDataModule
from data_modules.task import AnswerTask, Task
from data_modules.tokenizer import ByteTokenizer, Tokenizer

__all__ = [
    "AnswerTask",
    "ByteTokenizer",
    "DataError",
    "FlipFlopDataModule",
    "FormalLanguageDataModule",
    "HFDataModule",
    "KJVDataModule",
    "LocalDependencyDataModule",
    "ModCountDataModule",
    "MultiKeyNeedleDataModule",
    "MultiValueDataModule",
    "NBackDataModule",
    "PasskeyDataModule",
    "StdlibDataModule",
    "SyntheticDataModule",
    "Task",
    "TokenStreamDataModule",
    "TokenStreams",
    "TokenWindows",
    "Tokenizer",
    "VariableTrackingDataModule",
    "WordProblemDataModule",
    "stdlib_root",
]
