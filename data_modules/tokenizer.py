"""Tokenisers. The default is bytes: vocabulary 256, nothing to download.

A tokeniser is anything with ``name``, ``vocab_size``, ``encode`` and ``decode`` (:class:`Tokenizer`);
a Hugging Face tokeniser is wrapped to the same protocol by its data module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from accrot.errors import DataError


@runtime_checkable
class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: id = byte value, ``vocab_size = 256``.

    ``decode`` replaces invalid UTF-8 (a model's sample may cut a multi-byte character) instead of failing.
    """

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_bytes(self, data: bytes | bytearray) -> torch.Tensor:
        """Raw bytes -> ``[N]`` uint8 tensor, without going through ``str`` (no decoding, no copy per token)."""
        if len(data) == 0:
            return torch.empty(0, dtype=torch.uint8)
        buf = data if isinstance(data, bytearray) else bytearray(data)  # writable: frombuffer warns otherwise
        return torch.frombuffer(buf, dtype=torch.uint8)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = next((v for v in values if not 0 <= v < self.vocab_size), None)
        if bad is not None:
            raise DataError(
                f"token id {bad} is not a byte; the byte tokenizer's ids are 0..{self.vocab_size - 1}"
            )
        return bytes(values).decode("utf-8", errors="replace")

    def describe(self) -> dict:
        return {"name": self.name, "vocab_size": self.vocab_size}
