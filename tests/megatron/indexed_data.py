"""A tiny Megatron indexed data set, written the way Megatron reads it.

The ``mmap`` format of ``megatron/data/indexed_dataset.py`` (deepspeedai/Megatron-DeepSpeed
4efb479, ``MMapIndexedDataset.Index.writer``): ``PREFIX.idx`` holds the magic
``MMIDIDX\\0\\0``, version 1 (``<Q``), the dtype code (``<B``, 8 = uint16), the number of
sequences and of document boundaries (``<Q`` each), then the sequence sizes (int32), their
byte offsets into ``PREFIX.bin`` (int64) and the document index (int64); ``PREFIX.bin`` the
tokens. Token ids stay below ``vocab`` (``NullTokenizer``'s end-of-document id is ``vocab``).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

__all__ = ["write_indexed_dataset"]

_MAGIC = b"MMIDIDX\x00\x00"
_UINT16 = 8


def write_indexed_dataset(prefix: Path, *, docs: int = 64, tokens_per_doc: int = 257,
                          vocab: int = 255, seed: int = 0) -> Path:
    """``docs`` random documents of ``tokens_per_doc`` tokens under ``prefix``; returns
    ``prefix`` (what ``--data-path`` takes)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(docs, tokens_per_doc), dtype=np.uint16)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.bin").write_bytes(tokens.tobytes(order="C"))
    sizes = np.full(docs, tokens_per_doc, dtype=np.int32)
    pointers = np.arange(docs, dtype=np.int64) * tokens_per_doc * 2
    doc_idx = np.arange(docs + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as fh:
        fh.write(_MAGIC)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", _UINT16))
        fh.write(struct.pack("<Q", docs))
        fh.write(struct.pack("<Q", len(doc_idx)))
        fh.write(sizes.tobytes(order="C"))
        fh.write(pointers.tobytes(order="C"))
        fh.write(doc_idx.tobytes(order="C"))
    return prefix
