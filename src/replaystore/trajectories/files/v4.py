"""Format 4: format 3's frames (:mod:`.v3`) without the texts a sample needs. Each
distinct prompt message and each split prompt's response is stored once per file,
after the frames (as it is, zstandard-compressed where that halves it, or as a prefix
link to a text of the previous step), indexed per step in the header. This module
holds the writer's table of texts, the header's prompt index and its checks, and the
reader's memory-mapped, CRC-32C-checked texts."""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard
from numpy.typing import NDArray

from replaystore.errors import StorageError
from replaystore.trajectories.files.frames import (
    CODEC_RAW,
    CODEC_ZSTD,
    compress_each,
    zstd_decompress,
)
from replaystore.trajectories.files.jsonfast import crc32c, crc32c_function
from replaystore.trajectories.files.prompts import PROMPT_LAYOUTS

#: Version 4: a text is stored zstandard-compressed only where that makes it at most
#: this fraction of its size. Reading a compressed text costs a decompression (about
#: 2-3 µs for 1.5 kB), a sample's cold read most of all; repetitive texts (page trees,
#: growing summaries of earlier steps) shrink well below it, prose-like ones do not.
TEXT_COMPRESSION_RATIO = 0.5
_TEXT_COMPRESS_MIN = 128
_TEXT_PROBE = 32
# Version 4 prefix links: a text of at least _PREFIX_MIN bytes whose first
# _PREFIX_SHARE of bytes (or more) are a previous step's text's is stored as a link
# (_PREFIX_HEAD: that text's number and the shared length, then the rest); at most
# _PREFIX_CHAIN links lead to a text stored whole (the cost of a cold read).
CODEC_PREFIX = 2
_PREFIX_MIN = 256
_PREFIX_SHARE = 0.5
_PREFIX_CHAIN = 8
_PREFIX_HEAD = struct.Struct("<II")


class TextTable:
    """Version 4, while a file is written: its texts (each distinct one once, UTF-8)
    and, per step in file order, the texts its prompt joins.

    A text that begins with most of a text of the previous step (a summary of the
    earlier steps that grows by a line each step) is stored as that text's number,
    the length of the shared start and the rest (:data:`CODEC_PREFIX`), at most
    :data:`_PREFIX_CHAIN` such links from a text stored whole: a conversation's
    texts then cost what each step adds, not what it repeats.

    Raises (:meth:`add`):
        UnicodeEncodeError: a text holds a lone surrogate (no UTF-8 for it).
    """

    __slots__ = (
        "codecs",
        "counts",
        "depths",
        "ids",
        "refs",
        "relative",
        "responses",
        "separators",
        "texts",
    )

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.texts: list[bytes] = []
        #: Each text's codec (:data:`CODEC_RAW` or :data:`CODEC_PREFIX`; :meth:`compress`
        #: makes some :data:`CODEC_ZSTD`).
        self.codecs: list[int] = []
        #: Each text's number of prefix links to a text stored whole (0: itself).
        self.depths: list[int] = []
        self.counts: list[int] = []
        self.refs: list[int] = []
        self.separators: list[int] = []
        self.responses: list[int] = []
        self.relative: list[bool] = []

    def add(self, text: str, earlier: Sequence[str] = ()) -> int:
        """The number of ``text`` (added when new; ``earlier``: texts of the previous
        step it may extend)."""
        number = self.ids.get(text)
        if number is not None:
            return number
        encoded = text.encode("utf-8")
        codec, depth = CODEC_RAW, 0
        if len(encoded) >= _PREFIX_MIN:
            best, shared = -1, 0
            # ASCII text: it must start with at least its first half's characters
            half = text[: (len(text) + 1) // 2] if len(encoded) == len(text) else ""
            for other in earlier:
                base = self.ids.get(other)
                if base is None or self.depths[base] >= _PREFIX_CHAIN:
                    continue
                if half and not other.startswith(half):
                    continue  # cannot share half of it (the usual case: one comparison)
                k = _common_prefix(text, other)
                if k > shared:
                    best, shared = base, k
            if best >= 0:
                cut = len(text[:shared].encode("utf-8"))
                if cut >= _PREFIX_SHARE * len(encoded):
                    encoded = _PREFIX_HEAD.pack(best, cut) + encoded[cut:]
                    codec, depth = CODEC_PREFIX, self.depths[best] + 1
        number = self.ids[text] = len(self.texts)
        self.texts.append(encoded)
        self.codecs.append(codec)
        self.depths.append(depth)
        return number

    def add_step(self, refs: Sequence[int], separator: int, response: int, relative: bool) -> None:
        """The next step's prompt: its texts (none: not split), separator, response text."""
        self.counts.append(len(refs))
        self.refs.extend(refs)
        self.separators.append(separator)
        self.responses.append(response)
        self.relative.append(bool(relative))

    def compress(self, level: int) -> None:
        """Store each text zstandard-compressed where that makes it at most
        :data:`TEXT_COMPRESSION_RATIO` of its size (else as it is: a sample reads it
        without a decompression). Texts under :data:`_TEXT_COMPRESS_MIN` bytes stay as
        they are. A file's texts tend to be alike: when a probe of them (about
        :data:`_TEXT_PROBE`, evenly spread) finds fewer than one in ten that halves, the
        others are not tried (compressing every text costs a write about as much as the
        rest of the file's encoding). Many texts are compressed by zstandard's own
        threads."""
        codecs = self.codecs
        todo = [
            i
            for i, t in enumerate(self.texts)
            if len(t) >= _TEXT_COMPRESS_MIN and codecs[i] == CODEC_RAW
        ]
        if len(todo) >= 2 * _TEXT_PROBE:
            every = len(todo) // _TEXT_PROBE
            probe = todo[::every]
            if 10 * self._compress(probe, level) < len(probe):
                return
            todo = [i for k, i in enumerate(todo) if k % every]
        self._compress(todo, level)

    def _compress(self, todo: Sequence[int], level: int) -> int:
        """Compress texts ``todo`` where that halves them; returns how many it did."""
        if not todo:
            return 0
        raw = [self.texts[i] for i in todo]
        packed = compress_each(raw, level)
        done = 0
        for i, text, small in zip(todo, raw, packed, strict=True):
            if len(small) <= TEXT_COMPRESSION_RATIO * len(text):
                self.texts[i] = small
                self.codecs[i] = CODEC_ZSTD
                done += 1
        return done

    def index(self) -> dict[str, NDArray[Any]]:
        """The header arrays (name -> array in its stored dtype), in
        :data:`PROMPT_ARRAYS` order."""
        codecs = self.codecs
        return {
            "text_lengths": np.array([len(t) for t in self.texts], dtype="<i4"),
            "text_crc32c": np.array(list(map(crc32c_function(), self.texts)), dtype="<u4"),
            "text_codec": np.array(codecs, dtype="u1"),
            "prompt_counts": np.array(self.counts, dtype="<i4"),
            "prompt_refs": np.array(self.refs, dtype="<i4"),
            "prompt_separators": np.array(self.separators, dtype="u1"),
            "prompt_responses": np.array(self.responses, dtype="<i4"),
            "prompt_relative": np.array(self.relative, dtype="u1"),
        }


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common start of ``a`` and ``b`` (a binary search of
    ``startswith``: O(log n) C comparisons, not a Python loop over characters)."""
    if a[:16] != b[:16]:
        return 0
    lo, hi = 16 if len(a) >= 16 and len(b) >= 16 else 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


#: Version 4 header arrays and their stored dtypes; ``prompt_index_crc32`` is the CRC32
#: of their bytes, in this order.
PROMPT_ARRAYS = (
    ("text_lengths", "<i4"),
    ("text_crc32c", "<u4"),
    ("text_codec", "u1"),
    ("prompt_counts", "<i4"),
    ("prompt_refs", "<i4"),
    ("prompt_separators", "u1"),
    ("prompt_responses", "<i4"),
    ("prompt_relative", "u1"),
)


def prompt_index_crc(arrays: Mapping[str, NDArray[Any]]) -> int:
    crc = 0
    for name, dtype in PROMPT_ARRAYS:
        crc = zlib.crc32(np.ascontiguousarray(arrays[name], dtype=dtype).tobytes(), crc)
    return crc


@dataclass(slots=True)
class TextIndex:
    """Version 4: where a file's texts are: each one's byte offset in the file, length
    and CRC32; they end at byte ``end`` (the file's size)."""

    path: Path
    offsets: NDArray[np.int64]
    lengths: NDArray[np.int32]
    crc: NDArray[np.uint32]
    codec: NDArray[np.uint8]
    end: int


def check_prompt_index(
    arrays: Mapping[str, NDArray[Any]], crc: Any, n_steps: int, path: Path, texts_start: int
) -> TextIndex:
    """A version 4 header's prompt arrays checked against each other and their CRC32.

    Raises:
        StorageError: they fail their CRC32, have the wrong sizes, or refer to texts
            that do not exist.
    """
    where = str(path)
    if not isinstance(crc, int) or prompt_index_crc(arrays) != crc:
        raise StorageError(
            f"{where}: its header's prompt index fails its CRC32 check (the file was changed "
            "or damaged after it was written)"
        )
    lengths = arrays["text_lengths"].astype(np.int64)
    codecs = arrays["text_codec"]
    counts = arrays["prompt_counts"].astype(np.int64)
    refs = arrays["prompt_refs"]
    separators = arrays["prompt_separators"]
    responses = arrays["prompt_responses"]
    n_texts = int(lengths.size)
    split = counts > 0
    ok = (
        arrays["text_crc32c"].size == n_texts
        and codecs.size == n_texts
        and (n_texts == 0 or int(codecs.max()) <= CODEC_PREFIX)
        and all(arrays[k].size == n_steps for k in ("prompt_counts", "prompt_separators"))
        and all(arrays[k].size == n_steps for k in ("prompt_responses", "prompt_relative"))
        and (n_texts == 0 or int(lengths.min()) >= 0)
        and (n_steps == 0 or int(counts.min()) >= 0)
        and int(refs.size) == int(counts.sum())
        and (refs.size == 0 or (int(refs.min()) >= 0 and int(refs.max()) < n_texts))
        and bool(np.all(np.where(split, separators < len(PROMPT_LAYOUTS), separators == 255)))
        and bool(np.all(np.where(split, (responses >= 0) & (responses < n_texts), responses < 0)))
    )
    if not ok:
        raise StorageError(f"{where}: its header's prompt index is inconsistent")
    offsets = texts_start + np.cumsum(lengths) - lengths
    return TextIndex(
        path,
        offsets.astype(np.int64),
        lengths.astype(np.int32),
        arrays["text_crc32c"].astype(np.uint32),
        codecs.astype(np.uint8),
        texts_start + int(lengths.sum()),
    )


class Texts:
    """Version 4: a file's texts, read through ``data`` (a memory map of the whole
    file: offsets are the file's), each checked against its CRC-32C when first read."""

    __slots__ = ("data", "index", "verified")

    def __init__(self, index: TextIndex, data: Any, verified: Any = None) -> None:
        self.index = index
        self.data = data
        #: Per text, whether its check passed: a view of a buffer's table of all its
        #: files' texts when given (one record whichever path reads a text), else own.
        self.verified = bytearray(int(index.lengths.size)) if verified is None else verified

    @classmethod
    def mapped(cls, index: TextIndex, verified: Any = None) -> Texts:
        """The texts read through a memory map of the file (pages read when touched);
        ``verified``: see :attr:`verified`.

        Raises:
            FileNotFoundError: the file is gone.
            StorageError: its size is not what its header says (or it is empty).
        """
        with open(index.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size != index.end or size == 0:
                raise StorageError(
                    f"{index.path} changed after the buffer was opened ({size} bytes, its "
                    f"header says {index.end}); reopen the buffer"
                )
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        return cls(index, data, verified)

    def raw(self, i: int) -> bytes:
        """Text ``i``'s bytes (decompressed), checked.

        Raises:
            IndexError: no text ``i``.
            StorageError: it fails its CRC32 check, or does not decompress.
        """
        if i < 0:
            raise IndexError(f"text number {i} is negative")
        index = self.index
        start = int(index.offsets[i])
        raw = self.data[start : start + int(index.lengths[i])]
        if not self.verified[i]:
            if crc32c(raw) != int(index.crc[i]):
                raise StorageError(
                    f"{index.path}: text {i} fails its CRC-32C check (the file was changed or "
                    "damaged after it was written)"
                )
            self.verified[i] = 1
        codec = index.codec[i]
        if codec == CODEC_ZSTD:
            return _text_decompress(raw, index.path, i)
        if codec == CODEC_PREFIX:
            return _text_extend(raw, index.path, i, self.raw)
        return raw

    def text(self, i: int) -> str:
        """Text ``i`` decoded (see :meth:`raw`; StorageError when it is not UTF-8)."""
        try:
            return self.raw(i).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StorageError(f"{self.index.path}: text {i} is not UTF-8 ({exc})") from None


def _text_extend(raw: bytes, path: Path, i: int, read: Any) -> bytes:
    """A version 4 prefix link (text ``i`` of ``path``, as stored) made whole:
    ``read(base)[:shared] + rest``, ``read`` giving a text of the same file by number.

    Raises:
        StorageError: the link is malformed (its base is not an earlier text, or is
            shorter than the shared length).
    """
    if len(raw) < _PREFIX_HEAD.size:
        raise StorageError(f"{path}: text {i} is a malformed prefix link")
    base, shared = _PREFIX_HEAD.unpack_from(raw)
    if base >= i:
        raise StorageError(f"{path}: text {i} links to text {base}, not an earlier one")
    whole = read(base)
    if len(whole) < shared:
        raise StorageError(f"{path}: text {i} shares {shared} bytes of a shorter text")
    return whole[:shared] + raw[_PREFIX_HEAD.size :]


def _text_decompress(raw: bytes, path: Path, i: int) -> bytes:
    """A compressed version 4 text, decompressed.

    Raises:
        StorageError: it does not decompress.
    """
    try:
        return zstd_decompress(raw)
    except zstandard.ZstdError as exc:
        raise StorageError(f"{path}: text {i} does not decompress ({exc})") from None
