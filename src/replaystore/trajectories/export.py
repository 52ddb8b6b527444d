"""Export training samples as a LLaMA-Factory dataset (ShareGPT or OpenAI-messages format;
SFT records, or KTO/DPO preference records: ``kind=``).

Input: samples as the trajectory buffer returns them, ``{"message": [chat
messages of the prompt], "action": "<raw model response>", ...}`` (other keys
are ignored). Output, in ``out_dir``:

* ``<dataset_name>.json`` (or ``.jsonl``): the training records;
* ``<dataset_name>_val.json(l)`` when ``val_ratio > 0``;
* ``images/<sha256 prefix>.<ext>``: images that arrived as base64 data URLs
  (and, with ``copy_images=True``, every image);
* ``dataset_info.json``: the entries ``<dataset_name>`` (and
  ``<dataset_name>_val``), merged into an existing file's other entries.

Record shapes (one per sample; every ``value``/``content`` is a string)::

    sharegpt: {"conversations": [{"from": "human", "value": "..."},
                                 {"from": "gpt", "value": "..."}, ...],
               "system": "<system prompt or ''>", "images": ["/abs/a.png", ...]}
    openai:   {"messages": [{"role": "system", "content": "..."},   (only if non-empty)
                            {"role": "user", "content": "..."},
                            {"role": "assistant", "content": "..."}, ...],
               "images": [...]}

The prompt's user/assistant messages become the turns, and the sample's
``action`` is appended as the final assistant turn (the one learned). A message
whose content is a list of parts becomes one string: the parts in order, joined
by ``"\\n"``, each text part as its text and each image part as ``<image>``.
Images are listed in ``images`` in the order of their placeholders.

Placeholder escaping: LLaMA-Factory finds images by counting the substring
``<image>`` in every message (``<video>`` and ``<audio>`` likewise), and a count
that differs from the number of images stops training. Page text and model
responses can contain these strings literally, so in text they are written with
HTML entities for the angle brackets: ``<image>`` -> ``&lt;image&gt;`` (same for
``<video>``, ``<audio>``). The escaped form has no ``<`` and therefore is never
counted; a reader (or model) sees the same token it would on an HTML page.
The only ``<image>`` strings in an exported record are the placeholders we put
there.

Checks on every record before any record file is written: roles alternate
user/assistant starting with user and ending with assistant, no empty
assistant turn, no image outside user turns, ``<image>`` count == number of
images, no ``<video>``/``<audio>`` left, every image file exists and is an
image. Failing samples are never dropped silently: with ``on_error="raise"``
(default) :class:`~replaystore.errors.ExportError` lists every failing sample
(index and reason) and nothing is left behind (images decoded on the way are
removed again); with ``on_error="skip"`` they are
left out, logged, and listed in :attr:`ExportReport.rejected`.

Confinement: a trajectory file names its screenshots by path, and a hostile or
damaged file can name any file on the machine (``/etc/passwd``, ``~/.ssh/...``);
with ``copy_images=True`` such a file would be copied into the dataset. Pass
``image_root=`` (typically the storage directory) and every file image must
resolve, after following symbolic links and ``..``, to a path inside it; any
other is refused with the path and the root named (a failing sample, as above).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from replaystore.atomic import atomic_open, atomic_write_bytes, atomic_write_json
from replaystore.errors import ArgumentError, ExportError, ImageError
from replaystore.images import (
    EXTENSIONS,
    decode_data_url,
    file_url_to_path,
    image_mime_type,
    image_part_url,
    read_image,
)

__all__ = [
    "IMAGE_PLACEHOLDER",
    "PLACEHOLDERS",
    "ExportReport",
    "Kind",
    "RejectedSample",
    "dataset_info_entry",
    "escape_placeholders",
    "export_buffer",
    "export_llamafactory",
    "sample_to_record",
    "validate_record",
]

logger = logging.getLogger("replaystore.trajectories.export")

IMAGE_PLACEHOLDER = "<image>"
#: The strings LLaMA-Factory treats as media placeholders, and how text spells them after export.
PLACEHOLDERS: dict[str, str] = {
    "<image>": "&lt;image&gt;",
    "<video>": "&lt;video&gt;",
    "<audio>": "&lt;audio&gt;",
}
IMAGES_DIR = "images"

Format = Literal["sharegpt", "openai"]
#: What the records train: supervised fine-tuning, or a preference stage (KTO, DPO).
Kind = Literal["sft", "kto", "dpo"]
_ROLE_NAMES = {
    "sharegpt": {"user": "human", "assistant": "gpt"},
    "openai": {"user": "user", "assistant": "assistant"},
}


def escape_placeholders(text: str) -> str:
    """``text`` with every literal ``<image>``/``<video>``/``<audio>`` written as
    ``&lt;image&gt;`` etc. (see the module docstring). Cost: O(len(text))."""
    for token, escaped in PLACEHOLDERS.items():
        if token in text:
            text = text.replace(token, escaped)
    return text


@dataclass(frozen=True, slots=True)
class RejectedSample:
    """A sample that could not be exported: its index in the input and why."""

    index: int
    reason: str


@dataclass(slots=True)
class ExportReport:
    """What :func:`export_llamafactory` wrote.

    Attributes:
        out_dir: the dataset directory (LLaMA-Factory's ``dataset_dir``).
        dataset_name: name of the training entry in ``dataset_info.json``
            (``<dataset_name>_val`` for the validation entry).
        train_file / val_file: the record files (``val_file`` is ``None`` without a split).
        dataset_info_file: path of ``dataset_info.json``.
        num_train / num_val: records written to each file.
        num_image_refs: image references over all written records.
        images_written: image files newly written under ``out_dir/images``.
        rejected: samples left out (only with ``on_error="skip"``).
    """

    out_dir: Path
    dataset_name: str
    train_file: Path
    val_file: Path | None
    dataset_info_file: Path
    num_train: int
    num_val: int
    num_image_refs: int
    images_written: int
    rejected: list[RejectedSample] = field(default_factory=list)


class _RecordError(Exception):
    """A sample cannot be converted; the message says why."""


@dataclass(slots=True)
class _ImageSink:
    """Resolves image URLs to the paths written in records.

    Images that must be stored in ``out_dir/images`` (decoded data URLs, or
    copies) are written as they are met, so memory stays bounded by one image;
    :meth:`discard` removes the files and directories this export created.
    """

    out_dir: Path
    copy_images: bool
    image_root: Path | None = None  # realpath; file images must lie inside it
    written: list[Path] = field(default_factory=list)
    created_dirs: list[Path] = field(default_factory=list)
    resolved: dict[str, str] = field(default_factory=dict)

    def resolve(self, url: str) -> str:
        """The record path for ``url``; each distinct URL is read at most once."""
        if url not in self.resolved:
            self.resolved[url] = self._resolve(url)
        return self.resolved[url]

    def _resolve(self, url: str) -> str:
        if url.startswith("data:"):
            try:
                mime, data = decode_data_url(url)
            except ImageError as exc:
                raise _RecordError(str(exc)) from None
            return self._stored(mime, data)
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme == "file":
            path = file_url_to_path(url)
        elif len(scheme) <= 1:  # a bare path (one letter: a Windows drive)
            path = Path(url)
        else:
            raise _RecordError(f"image URL {url[:60]!r} is not a file:// or data: URL")
        if self.image_root is not None:
            real = Path(os.path.realpath(path))
            if not real.is_relative_to(self.image_root):
                shown = str(path) if str(real) == str(path) else f"{path} (resolves to {real})"
                raise _RecordError(
                    f"image {shown} is outside the image root {self.image_root}: refused "
                    "(a trajectory file may name any file on this machine)"
                )
        try:
            if not self.copy_images:
                image_mime_type(path)
                return str(path.absolute())
            mime, data = read_image(path)
        except ImageError as exc:
            raise _RecordError(str(exc)) from None
        return self._stored(mime, data)

    def _stored(self, mime: str, data: bytes) -> str:
        name = f"{hashlib.sha256(data).hexdigest()[:32]}{EXTENSIONS[mime]}"
        directory = self.out_dir / IMAGES_DIR
        target = directory / name
        if not target.is_file():
            missing = [d for d in (directory, *directory.parents) if not d.exists()]
            for d in reversed(missing):
                d.mkdir(exist_ok=True)
                self.created_dirs.append(d)
            atomic_write_bytes(target, data)
            self.written.append(target)
        return f"{IMAGES_DIR}/{name}" if self.copy_images else str(target)

    def discard(self) -> None:
        """Remove the images (and then-empty directories) this export created."""
        for path in self.written:
            path.unlink(missing_ok=True)
        for directory in reversed(self.created_dirs):
            with contextlib.suppress(OSError):
                directory.rmdir()


def _content_text(content: Any, where: str, images: list[str], sink: _ImageSink | None) -> str:
    """One string for a message's content; image parts become placeholders."""
    if isinstance(content, str):
        return escape_placeholders(content)
    if content is None:
        return ""
    if not isinstance(content, list):
        raise _RecordError(f"{where} content is a {type(content).__name__}")
    pieces: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            pieces.append(escape_placeholders(part))
            continue
        if not isinstance(part, Mapping):
            raise _RecordError(f"{where}.content[{j}] is a {type(part).__name__}")
        try:
            url = image_part_url(part)
        except ImageError as exc:
            raise _RecordError(f"{where}.content[{j}]: {exc}") from None
        if url is not None:
            if sink is None:
                raise _RecordError(f"{where}.content[{j}] is an image outside a user turn")
            try:
                images.append(sink.resolve(url))
            except ImageError as exc:
                raise _RecordError(f"{where}.content[{j}]: {exc}") from None
            except _RecordError as exc:
                raise _RecordError(f"{where}.content[{j}]: {exc}") from None
            pieces.append(IMAGE_PLACEHOLDER)
        elif part.get("type") == "text" and isinstance(part.get("text"), str):
            pieces.append(escape_placeholders(part["text"]))
        else:
            raise _RecordError(f"{where}.content[{j}] has unsupported type {part.get('type')!r}")
    return "\n".join(pieces)


def _to_record(sample: Any, fmt: Format, sink: _ImageSink) -> dict[str, Any]:
    if not isinstance(sample, Mapping):
        raise _RecordError(f"sample is a {type(sample).__name__}, not a mapping")
    for key in ("message", "action"):
        if key not in sample:
            raise _RecordError(f"sample has no {key!r}")
    messages = sample["message"]
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as exc:
            raise _RecordError(f"message is a string but not JSON: {exc}") from None
    if not isinstance(messages, list):
        raise _RecordError(f"message is a {type(messages).__name__}, not a list")
    action = sample["action"]
    if not isinstance(action, str):
        raise _RecordError(f"action is a {type(action).__name__}, not a str")

    system: list[str] = []
    turns: list[tuple[str, str]] = []
    images: list[str] = []
    for i, message in enumerate(messages):
        where = f"message[{i}]"
        if not isinstance(message, Mapping) or "role" not in message:
            raise _RecordError(f"{where} is not a chat message with a role")
        role = message["role"]
        if role == "system":
            if turns:
                raise _RecordError(f"{where} is a system message after the conversation started")
            system.append(_content_text(message.get("content"), where, images, None))
        elif role in ("user", "assistant"):
            user_sink = sink if role == "user" else None
            turns.append((role, _content_text(message.get("content"), where, images, user_sink)))
        else:
            raise _RecordError(f"{where} has unsupported role {role!r}")
    turns.append(("assistant", escape_placeholders(action)))

    names = _ROLE_NAMES[fmt]
    system_text = "\n\n".join(system)
    if fmt == "sharegpt":
        conversation = [{"from": names[role], "value": text} for role, text in turns]
        return {"conversations": conversation, "system": system_text, "images": images}
    head = [{"role": "system", "content": system_text}] if system_text else []
    body = [{"role": names[role], "content": text} for role, text in turns]
    return {"messages": head + body, "images": images}


def validate_record(
    record: Mapping[str, Any], fmt: Format = "sharegpt", base_dir: str | os.PathLike[str] = "."
) -> list[str]:
    """The problems LLaMA-Factory would hit with ``record`` (empty list: none).

    Checks: turns alternate user/assistant starting with user and ending with a
    non-empty assistant turn (a leading system turn allowed in ``openai``
    format), every value a string, ``<image>`` count equals ``len(images)``, no
    ``<video>``/``<audio>`` placeholder, every image file exists (relative
    paths resolved against ``base_dir``, as LLaMA-Factory's ``media_dir``).
    """
    _check_format(fmt)
    if fmt == "sharegpt":
        key, role_key, content_key = "conversations", "from", "value"
    else:
        key, role_key, content_key = "messages", "role", "content"
    names = _ROLE_NAMES[fmt]
    turns = record.get(key)
    if not isinstance(turns, list) or not turns:
        return [f"{key!r} is missing or empty"]
    texts: list[Any] = []
    if fmt == "sharegpt":
        texts.append(record.get("system", ""))
    elif isinstance(turns[0], Mapping) and turns[0].get(role_key) == "system":
        texts.append(turns[0].get(content_key))
        turns = turns[1:]
    problems: list[str] = []
    for i, turn in enumerate(turns):
        expected = names["user"] if i % 2 == 0 else names["assistant"]
        got = turn.get(role_key) if isinstance(turn, Mapping) else type(turn).__name__
        if got != expected:
            problems.append(f"turn {i} should be {expected!r}, got {got!r}")
        else:
            texts.append(turn.get(content_key))
    if len(turns) % 2 != 0:
        problems.append(f"conversation ends on {names['user']!r}, not {names['assistant']!r}")
    elif turns and isinstance(turns[-1], Mapping) and not str(turns[-1].get(content_key)).strip():
        problems.append("the final assistant turn is empty")
    if any(not isinstance(text, str) for text in texts):
        return [*problems, "a message value is not a string"]
    images = record.get("images", [])
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        return [*problems, "'images' is not a list of paths"]
    count = sum(text.count(IMAGE_PLACEHOLDER) for text in texts)
    if count != len(images):
        problems.append(f"{count} {IMAGE_PLACEHOLDER} placeholders for {len(images)} images")
    for token in ("<video>", "<audio>"):
        if any(token in text for text in texts):
            problems.append(f"unescaped {token} with no videos/audios")
    for image in images:
        path = Path(base_dir, image)  # an absolute image path replaces base_dir
        if not path.is_file():
            problems.append(f"image file not found: {path}")
    return problems


def sample_to_record(
    sample: Mapping[str, Any],
    *,
    format: Format = "sharegpt",
    out_dir: str | os.PathLike[str] = ".",
    copy_images: bool = False,
) -> dict[str, Any]:
    """The record for one sample (shapes in the module docstring), not validated.

    Images from data URLs (and, with ``copy_images``, all images) are written
    to ``out_dir/images`` (content-addressed), as an export would.

    Raises:
        ExportError: the sample cannot be converted (the reason is named).
    """
    _check_format(format)
    sink = _ImageSink(Path(out_dir).absolute(), copy_images)
    try:
        return _to_record(sample, format, sink)
    except _RecordError as exc:
        raise ExportError(f"sample cannot be exported: {exc}") from None


def dataset_info_entry(
    file_name: str, format: Format = "sharegpt", kind: Kind = "sft"
) -> dict[str, Any]:
    """The ``dataset_info.json`` entry for a file of records in ``format``.

    ``kind``: ``"sft"`` (the default), ``"kto"`` (adds the ``kto_tag`` column) or
    ``"dpo"`` (``ranking: true`` with the ``chosen``/``rejected`` columns); the
    preference kinds are written in ``sharegpt`` format only.
    """
    _check_format(format)
    _check_kind(kind, format)
    if format == "sharegpt":
        entry: dict[str, Any] = {
            "file_name": file_name,
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "system": "system", "images": "images"},
            "tags": {
                "role_tag": "from",
                "content_tag": "value",
                "user_tag": "human",
                "assistant_tag": "gpt",
            },
        }
        if kind == "kto":
            entry["columns"]["kto_tag"] = "kto_tag"
        elif kind == "dpo":
            entry["ranking"] = True
            entry["columns"].update(chosen="chosen", rejected="rejected")
        return entry
    return {
        "file_name": file_name,
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
            "system_tag": "system",
        },
    }


def _check_format(fmt: str) -> None:
    if fmt not in _ROLE_NAMES:
        raise ArgumentError(f"format must be 'sharegpt' or 'openai', got {fmt!r}")


def _check_kind(kind: str, fmt: str) -> None:
    if kind not in ("sft", "kto", "dpo"):
        raise ArgumentError(f"kind must be 'sft', 'kto' or 'dpo', got {kind!r}")
    if kind != "sft" and fmt != "sharegpt":
        raise ArgumentError(f"{kind} datasets are written in sharegpt format, not {fmt!r}")


def _write_records(path: Path, records: Sequence[Mapping[str, Any]], file_format: str) -> None:
    with atomic_open(path, "w") as handle:
        if file_format == "jsonl":
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False))
                handle.write("\n")
        else:
            json.dump(list(records), handle, ensure_ascii=False, indent=1)
            handle.write("\n")


def _convert_all(
    samples: Sequence[Mapping[str, Any]], fmt: Format, sink: _ImageSink, kind: Kind = "sft"
) -> tuple[list[dict[str, Any]], list[RejectedSample]]:
    """Records of the good samples, and the bad ones with their reasons."""
    records: list[dict[str, Any]] = []
    rejected: list[RejectedSample] = []
    for index, sample in enumerate(samples):
        try:
            record = _to_kind_record(sample, fmt, sink, kind)
        except _RecordError as exc:
            rejected.append(RejectedSample(index, str(exc)))
            continue
        problems = validate_record(_as_sft(record, kind), fmt, sink.out_dir)
        if kind == "dpo" and not record["rejected"]["value"].strip():
            problems.append("the rejected response is empty")
        if problems:
            rejected.append(RejectedSample(index, "; ".join(problems)))
        else:
            records.append(record)
    return records, rejected


def _to_kind_record(sample: Any, fmt: Format, sink: _ImageSink, kind: Kind) -> dict[str, Any]:
    """An SFT record, a KTO record (plus ``kto_tag``) or a DPO record (the conversation up
    to the last user turn, ``chosen`` and ``rejected``)."""
    if kind == "sft":
        return _to_record(sample, fmt, sink)
    if not isinstance(sample, Mapping):
        raise _RecordError(f"sample is a {type(sample).__name__}, not a mapping")
    if kind == "kto":
        tag = sample.get("kto_tag")
        if not isinstance(tag, bool):
            raise _RecordError(f"kto_tag is {tag!r}, not true or false")
        return {**_to_record(sample, fmt, sink), "kto_tag": tag}
    for key in ("chosen", "rejected"):
        if not isinstance(sample.get(key), str):
            raise _RecordError(f"{key} is {type(sample.get(key)).__name__}, not a str")
    if sample["chosen"] == sample["rejected"]:
        raise _RecordError("chosen and rejected are the same response")
    record = _to_record({"message": sample.get("message"), "action": sample["chosen"]}, fmt, sink)
    chosen = record["conversations"].pop()
    rejected = {"from": chosen["from"], "value": escape_placeholders(sample["rejected"])}
    return {**record, "chosen": chosen, "rejected": rejected}


def _as_sft(record: dict[str, Any], kind: Kind) -> dict[str, Any]:
    """The record as an SFT record, for :func:`validate_record` (a DPO record with its
    chosen response as the final turn)."""
    if kind != "dpo":
        return record
    return {**record, "conversations": [*record["conversations"], record["chosen"]]}


def export_llamafactory(
    samples: Sequence[Mapping[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    dataset_name: str = "replaystore",
    format: Format = "sharegpt",
    kind: Kind = "sft",
    val_ratio: float = 0.0,
    seed: int | None = 0,
    shuffle: bool = True,
    file_format: Literal["json", "jsonl"] = "json",
    copy_images: bool = False,
    on_error: Literal["raise", "skip"] = "raise",
    image_root: str | os.PathLike[str] | None = None,
) -> ExportReport:
    """Write ``samples`` as a LLaMA-Factory dataset in ``out_dir`` (layout in the module doc).

    Args:
        samples: buffer samples (``{"message": [...], "action": str, ...}``).
        out_dir: dataset directory; created if missing. Point LLaMA-Factory's
            ``dataset_dir`` here and use ``dataset: <dataset_name>``
            (``eval_dataset: <dataset_name>_val`` with a split).
        dataset_name: entry name in ``dataset_info.json`` and file name stem.
        format: ``"sharegpt"`` (``conversations`` with from/value, ``system``
            column) or ``"openai"`` (``messages`` with role/content).
        kind: what the records train. ``"sft"``: samples as above. ``"kto"``: each
            sample also has ``kto_tag`` (bool: desirable or not), written beside the
            conversation. ``"dpo"``: samples ``{"message", "chosen", "rejected"}``,
            written as the conversation up to the last user turn with ``chosen`` and
            ``rejected`` assistant turns (LLaMA-Factory's ``ranking`` datasets). Both
            preference kinds need ``format="sharegpt"``;
            :mod:`replaystore.trajectories.preference` makes their samples from a
            storage's successes and failures.
        val_ratio: share of records for validation, in [0, 1):
            ``round(n * val_ratio)`` records, at least 1 when ``val_ratio > 0``
            and ``n >= 2``, always leaving at least one for training.
        seed: seed of the shuffle (same seed and samples -> same files).
        shuffle: shuffle records before splitting (else input order is kept).
        file_format: ``"json"`` (one JSON array) or ``"jsonl"`` (one record per line).
        copy_images: copy every image into ``out_dir/images`` and write paths
            relative to ``out_dir`` (a self-contained, movable dataset); by
            default file images are referenced by absolute path. Images from
            data URLs always go to ``out_dir/images``.
        on_error: ``"raise"``: any bad sample raises and nothing is written;
            ``"skip"``: bad samples are left out and listed in the report.
        image_root: when given, an existing directory every file image must lie
            in (symbolic links and ``..`` resolved first); an image elsewhere
            fails its sample ("outside the image root"). Use the storage
            directory for trajectories from files you did not write. ``None``
            (default): any readable image file is accepted.

    Every file is written atomically; ``dataset_info.json`` last, so a dataset
    is never registered before its files are complete. Cost: O(total message
    size) plus one read per distinct image (hashing when copying/decoding).

    Raises:
        ExportError: bad samples with ``on_error="raise"`` (each listed with its
            index and reason), no exportable sample, or an unreadable existing
            ``dataset_info.json``.
        ValueError: an invalid argument (``image_root`` not a directory included).
    """
    confined = _check_export_arguments(
        format, kind, file_format, on_error, val_ratio, dataset_name, image_root
    )
    root = Path(out_dir).absolute()
    info_path = root / "dataset_info.json"
    info = _read_dataset_info(info_path)

    sink = _ImageSink(root, copy_images, confined)
    records, rejected = _convert_or_refuse(samples, format, sink, kind, on_error)
    train, val = _split(records, shuffle, seed, val_ratio)

    root.mkdir(parents=True, exist_ok=True)
    train_file = root / f"{dataset_name}.{file_format}"
    _write_records(train_file, train, file_format)
    info[dataset_name] = dataset_info_entry(train_file.name, format, kind)
    val_file = None
    if val:
        val_file = root / f"{dataset_name}_val.{file_format}"
        _write_records(val_file, val, file_format)
        info[f"{dataset_name}_val"] = dataset_info_entry(val_file.name, format, kind)
    else:
        info.pop(f"{dataset_name}_val", None)
    atomic_write_json(info_path, info)
    report = ExportReport(
        out_dir=root,
        dataset_name=dataset_name,
        train_file=train_file,
        val_file=val_file,
        dataset_info_file=info_path,
        num_train=len(train),
        num_val=len(val),
        num_image_refs=sum(len(r["images"]) for r in records),
        images_written=len(sink.written),
        rejected=rejected,
    )
    logger.info(
        "exported %d train / %d val records (%d images) to %s",
        report.num_train,
        report.num_val,
        report.num_image_refs,
        root,
    )
    return report


def _check_export_arguments(
    format: Format,
    kind: Kind,
    file_format: str,
    on_error: str,
    val_ratio: float,
    dataset_name: str,
    image_root: str | os.PathLike[str] | None,
) -> Path | None:
    """:func:`export_llamafactory`'s checks of its arguments; the resolved image root."""
    _check_format(format)
    _check_kind(kind, format)
    if file_format not in ("json", "jsonl"):
        raise ArgumentError(f"file_format must be 'json' or 'jsonl', got {file_format!r}")
    if on_error not in ("raise", "skip"):
        raise ArgumentError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if not 0.0 <= val_ratio < 1.0:
        raise ArgumentError(f"val_ratio must be in [0, 1), got {val_ratio!r}")
    if not dataset_name or any(c in dataset_name for c in "/\\\0"):
        raise ArgumentError(
            f"dataset_name must be a non-empty file name stem, got {dataset_name!r}"
        )
    if image_root is None:
        return None
    confined = Path(os.path.realpath(image_root))
    if not confined.is_dir():
        raise ArgumentError(f"image_root must be an existing directory, got {image_root!r}")
    return confined


def _convert_or_refuse(
    samples: Sequence[Mapping[str, Any]],
    format: Format,
    sink: _ImageSink,
    kind: Kind,
    on_error: str,
) -> tuple[list[dict[str, Any]], list[RejectedSample]]:
    """The records of ``samples`` and the rejected ones; with ``on_error="raise"`` any
    rejected sample (or none exportable) raises, and images already written are removed."""
    try:
        records, rejected = _convert_all(samples, format, sink, kind)
        if rejected and on_error == "raise":
            listed = "\n".join(f"  sample {r.index}: {r.reason}" for r in rejected[:20])
            more = f"\n  ... and {len(rejected) - 20} more" if len(rejected) > 20 else ""
            raise ExportError(
                f"{len(rejected)} of {len(samples)} samples cannot be exported; "
                f"nothing was written:\n{listed}{more}"
            )
        if not records:
            raise ExportError(f"no exportable samples (got {len(samples)}); nothing was written")
    except BaseException:
        sink.discard()
        raise
    for r in rejected:
        logger.warning("sample %d left out of the export: %s", r.index, r.reason)
    return records, rejected


def _split(
    records: list[dict[str, Any]], shuffle: bool, seed: int | None, val_ratio: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, val)``: ``round(n * val_ratio)`` records for validation (at least 1 when
    ``val_ratio > 0`` and ``n >= 2``, always one left for training), after a seeded shuffle."""
    order = np.arange(len(records))
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(records))
    n_val = 0
    if val_ratio > 0 and len(records) >= 2:
        n_val = min(max(1, round(len(records) * val_ratio)), len(records) - 1)
    return [records[i] for i in order[n_val:]], [records[i] for i in order[:n_val]]


def _read_dataset_info(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"existing {path} is not readable JSON: {exc}") from None
    if not isinstance(info, dict):
        raise ExportError(f"existing {path} is not a JSON object")
    return info


def export_buffer(
    buffer: Any,
    out_dir: str | os.PathLike[str],
    *,
    num_samples: int | None = None,
    recency_bias_power: float = 1.0,
    seed: int | None = 0,
    **kwargs: Any,
) -> ExportReport:
    """Sample a trajectory buffer and export the samples (see :func:`export_llamafactory`).

    Calls ``buffer.get_training_samples(num_samples, recency_bias_power, seed)``
    (training-eligible samples: successful trajectories, changed screenshots)
    and passes ``seed`` and ``kwargs`` on to :func:`export_llamafactory`
    (e.g. ``image_root=`` the storage directory, to refuse images outside it).
    """
    samples = buffer.get_training_samples(
        num_samples=num_samples, recency_bias_power=recency_bias_power, seed=seed
    )
    return export_llamafactory(samples, out_dir, seed=seed, **kwargs)
