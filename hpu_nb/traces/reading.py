"""Bounded reading of a trace file: its (decompressed) bytes in blocks of about BLOCK_SIZE, plain or gzipped.

A gzip stream cut short or corrupt yields all it had (zlib's error goes into the parse stats), and zlib is fed small
pieces so a corruption loses little: the parser above sees one kind of input whatever the file.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

from hpu_nb.traces.parse_stats import ParseStats

BLOCK_SIZE = 8 << 20  # bytes read per step; bounds the transient memory of the parser
GZIP_READ_SIZE = 256 << 10  # compressed bytes read at a time
GZIP_FEED_SIZE = 16 << 10  # compressed bytes handed to zlib at once: a corruption loses at most this much output


def is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def read_blocks(path: str, stats: ParseStats, block_size: int) -> Iterator[bytes]:
    """The file's (decompressed) bytes in blocks; a gzip stream cut short or corrupt yields all it had."""
    with open(path, "rb") as fh:
        if not is_gzip(path):
            while block := fh.read(block_size):
                stats.bytes_read += len(block)
                yield block
            return
        pending: list[bytes] = []  # decompressed output, handed on in blocks of about block_size
        pending_size = 0
        for out in gunzip_pieces(fh, stats, lambda: stats.bytes_read + pending_size):  # noqa: B023 -- the size now, on purpose
            pending.append(out)
            pending_size += len(out)
            if pending_size >= block_size:
                stats.bytes_read += pending_size
                yield b"".join(pending)
                pending, pending_size = [], 0
        if pending_size:
            stats.bytes_read += pending_size
            yield b"".join(pending)


def gunzip_pieces(fh: Any, stats: ParseStats, produced: Any) -> Iterator[bytes]:
    """Decompressed pieces of a gzip file (concatenated members too), each at most about GZIP_FEED_SIZE x the
    compression ratio; at a corrupt point, stops after noting zlib's error in `stats` (all output before it is kept)."""
    unzip = zlib.decompressobj(wbits=31)
    while read := fh.read(GZIP_READ_SIZE):
        for at in range(0, len(read), GZIP_FEED_SIZE):  # small feeds: a corruption loses at most one feed's output
            chunk = read[at : at + GZIP_FEED_SIZE]
            while chunk:
                try:
                    out = unzip.decompress(chunk)
                except zlib.error as err:
                    stats.gzip_error = f"{err} (after {produced():,} decompressed bytes)"
                    stats.truncated = True
                    return
                if out:
                    yield out
                chunk = b""
                if unzip.eof:  # the next member, if any, starts in what this one left
                    chunk = unzip.unused_data
                    unzip = zlib.decompressobj(wbits=31)
    if not unzip.eof and unzip.unconsumed_tail == b"" and (tail := unzip.flush()):
        yield tail
