"""Zstandard and CRC32 framing of format 3-4 trajectory frames (and format 4 texts):
the codec numbers, per-thread compressors, compressing many frames at once, and
reading one frame checked against its CRC32."""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zstandard

from replaystore.errors import StorageError

#: Default zstandard level of version 3-4 frames (and version 4 texts).
COMPRESSION_LEVEL = 2
# A step's checksum when it has none (version 1 files).
NO_CRC = -1
# Version 3 frame codecs (index.frame_codec): stored as they are, or one zstandard frame.
CODEC_RAW = 0
CODEC_ZSTD = 1
# Frames of one file are compressed by up to this many zstandard threads, when they
# hold at least _PARALLEL_BYTES (below that, starting threads costs more than it saves).
_COMPRESS_THREADS = 2
_PARALLEL_BYTES = 1 << 20


_ZSTD = threading.local()


def _zstd_compressor(level: int) -> Any:
    """This thread's zstandard compressor for ``level`` (they are not thread-safe)."""
    cache = getattr(_ZSTD, "compressors", None)
    if cache is None:
        cache = _ZSTD.compressors = {}
    compressor = cache.get(level)
    if compressor is None:
        compressor = cache[level] = zstandard.ZstdCompressor(
            level=level, write_checksum=False, write_content_size=True
        )
    return compressor


def compress_each(raw: Sequence[bytes], level: int) -> list[bytes]:
    """Each of ``raw`` as one zstandard frame. From :data:`_PARALLEL_BYTES` in all they
    are compressed by zstandard's own threads (the same bytes as one at a time)."""
    compressor = _zstd_compressor(level)
    threads = min(_COMPRESS_THREADS, os.cpu_count() or 1)
    if threads > 1 and len(raw) > 1 and sum(map(len, raw)) >= _PARALLEL_BYTES:
        try:
            batch = compressor.multi_compress_to_buffer(list(raw), threads=threads)
            return [batch[i].tobytes() for i in range(len(raw))]
        except (AttributeError, NotImplementedError):  # a zstandard backend without it
            pass
    return [compressor.compress(data) for data in raw]


def zstd_decompress(data: bytes) -> bytes:
    decompressor = getattr(_ZSTD, "decompressor", None)
    if decompressor is None:
        decompressor = _ZSTD.decompressor = zstandard.ZstdDecompressor()
    return bytes(decompressor.decompress(data))


def read_frame(
    path: str | Path, offset: int, length: int, crc: int, codec: int, where: str
) -> bytes:
    """The decoded bytes of one version 3 frame, checked against its CRC32.

    Raises:
        FileNotFoundError: the file is gone.
        StorageError: the frame is short, fails its checksum or does not decode.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    return decode_frame(raw, length, crc, codec, where)


def decode_frame(raw: bytes, length: int, crc: int, codec: int, where: str) -> bytes:
    """A frame as read (``raw``) checked against its length and CRC32, decoded."""
    if len(raw) != length or zlib.crc32(raw) != crc:
        raise StorageError(
            f"{where}: its frame fails its CRC32 check (the file was changed or damaged "
            "after it was written)"
        )
    if codec == CODEC_RAW:
        return raw
    try:
        return zstd_decompress(raw)
    except zstandard.ZstdError as exc:
        raise StorageError(f"{where}: its frame does not decompress ({exc})") from None
