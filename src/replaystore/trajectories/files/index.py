"""The buffer index of stored steps, built from iteration file headers alone: per
step its trajectory, reward, flags and where it is (a line's offset, or its
trajectory's frame; format 4: its prompt's texts), and the :class:`FileSource`
that reads the steps."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from replaystore.formats.trajectory_header import Header
from replaystore.trajectories.files.reader import FileSource, FrameTable, Prompts
from replaystore.trajectories.files.v4 import TextIndex
from replaystore.trajectories.index import StepIndex, final_reward_values

if TYPE_CHECKING:
    from replaystore.trajectories.storage import TrajectoryStorage


def build_step_index(storage: TrajectoryStorage, headers: Sequence[Header]) -> StepIndex:
    """The :class:`StepIndex` of the steps of ``headers``' files (read through
    ``storage``; see :meth:`TrajectoryStorage.build_index`).

    Raises:
        TrajectoryError: a non-dummy trajectory's final reward is None or not a number.
    """
    parts: dict[str, list[Any]] = defaultdict(list)
    dummies = 0
    first_traj = 0
    for file_id, h in enumerate(headers):
        dummies += _add_file(parts, file_id, h, first_traj)
        first_traj += int(h.lengths.size)
    prompts, texts = _prompts_of(headers, parts["keeps"])
    source = FileSource(
        storage,
        [h.file.path for h in headers],
        np.concatenate(parts["file"]),
        np.concatenate(parts["offset"]).astype(np.int64),
        np.concatenate(parts["traj_file"]),
        np.concatenate(parts["traj_local"]),
        np.concatenate(parts["crc"]).astype(np.int64),
        _frame_table(headers, parts["frames"]),
        texts,
        prompts,
    )
    prompt_parts = parts["prompt"]
    return StepIndex(
        traj=np.concatenate(parts["traj"]).astype(np.int64),
        step=np.concatenate(parts["step"]),
        reward=np.concatenate(parts["reward"]),
        same=np.concatenate(parts["same"]),
        trajectory_rewards=np.concatenate(parts["traj_rewards"]),
        dummy_trajectories=dummies,
        computed_steps=0,
        missing_screenshots=0,
        source=source,
        # known only when every file's header has it (older files do not)
        has_prompt=np.concatenate(prompt_parts) if len(prompt_parts) == len(headers) else None,
    )


def _add_file(parts: dict[str, list[Any]], file_id: int, h: Header, first_traj: int) -> int:
    """File ``file_id``'s entries appended to ``parts`` (its trajectories numbered from
    ``first_traj``); returns its number of dummy trajectories."""
    n_traj = int(h.lengths.size)
    lengths = h.lengths.astype(np.int64)
    keep = ~h.dummy
    rewards = np.zeros(n_traj)
    kept = np.flatnonzero(keep)
    finals = h.final_rewards
    rewards[kept] = final_reward_values(
        finals if kept.size == n_traj else [finals[t] for t in kept.tolist()],
        lengths[kept] - 1,
        lambda k: f"trajectory {first_traj + kept[k]} (trajectory {kept[k]} of {h.file.path})",
    )
    step_keep = np.repeat(keep, lengths)
    starts = np.cumsum(lengths) - lengths
    if h.record is not None:  # record steps are stored, never samples
        step_keep[(starts + lengths - 1)[h.record & keep]] = False
    parts["keeps"].append(step_keep)
    local_step = np.arange(h.num_steps, dtype=np.int64) - np.repeat(starts, lengths)
    if h.frame_lengths is not None:  # version 3: steps are found through their frame
        offsets = np.full(h.num_steps, -1, dtype=np.int64)
        parts["frames"].append(
            (
                h.frame_offsets(),
                h.frame_lengths,
                h.frame_crc,
                h.frame_codec,
                h.message_counts,
            )
        )
    else:
        offsets = h.body_start + np.cumsum(h.line_lengths) - h.line_lengths
        parts["frames"].append(None)
    traj_ids = np.repeat(np.arange(first_traj, first_traj + n_traj), lengths)
    parts["traj"].append(traj_ids[step_keep])
    parts["step"].append(local_step[step_keep].astype(np.int32))
    parts["reward"].append(np.repeat(rewards, lengths)[step_keep])
    same = h.same.copy()
    same[(starts + lengths - 1)[lengths > 0]] = False
    parts["same"].append(same[step_keep])
    parts["file"].append(np.full(int(step_keep.sum()), file_id, dtype=np.int32))
    parts["offset"].append(offsets[step_keep])
    parts["crc"].append(h.line_crc[step_keep])
    if h.has_prompt is not None:
        parts["prompt"].append(h.has_prompt[step_keep])
    parts["traj_rewards"].append(rewards[keep])
    parts["traj_file"].append(np.full(n_traj, file_id, dtype=np.int32))
    parts["traj_local"].append(np.arange(n_traj, dtype=np.int32))
    return int(h.dummy.sum())


def _frame_table(
    headers: Sequence[Header], parts: Sequence[tuple[Any, ...] | None]
) -> FrameTable | None:
    """Per trajectory (all files, in order): where its version 3 frame is; None
    when no file is version 3. Trajectories of older files get length 0."""
    if all(part is None for part in parts):
        return None
    columns: list[list[NDArray[Any]]] = [[], [], [], [], [], []]
    for h, part in zip(headers, parts, strict=True):
        n = int(h.lengths.size)
        if part is None:
            part = tuple(np.zeros(n, dtype=np.int64) for _ in range(5))
        for column, values in zip(columns, (*part, h.lengths), strict=True):
            column.append(np.asarray(values, dtype=np.int64))
    offset, length, crc, codec, messages, steps = (np.concatenate(c) for c in columns)
    return FrameTable(
        offset,
        length,
        crc,
        codec.astype(np.uint8),
        messages.astype(np.int32),
        steps.astype(np.int32),
    )


def _prompts_of(
    headers: Sequence[Header], keeps: Sequence[NDArray[np.bool_]]
) -> tuple[Prompts | None, list[TextIndex | None]]:
    """The :class:`Prompts` of the indexed steps (``keeps``: per file, which of its
    steps are indexed), None when no file is version 4; and each file's text index."""
    texts = [h.texts for h in headers]
    if all(t is None for t in texts):
        return None, texts
    counts: list[NDArray[Any]] = []
    starts: list[NDArray[Any]] = []
    responses: list[NDArray[Any]] = []
    relative: list[NDArray[Any]] = []
    refs: list[NDArray[Any]] = []
    text_file: list[NDArray[Any]] = []
    text_offset: list[NDArray[Any]] = []
    text_length: list[NDArray[Any]] = []
    text_crc: list[NDArray[Any]] = []
    text_codec: list[NDArray[Any]] = []
    text_base = ref_base = 0
    for file_id, (h, keep) in enumerate(zip(headers, keeps, strict=True)):
        if h.texts is None or h.prompt_counts is None:
            counts.append(np.full(int(keep.sum()), -1, dtype=np.int32))
            for part in (starts, responses):
                part.append(np.zeros(int(keep.sum()), dtype=np.int64))
            relative.append(np.zeros(int(keep.sum()), dtype=np.uint8))
            continue
        assert h.prompt_starts is not None and h.prompt_refs is not None
        assert h.prompt_responses is not None and h.prompt_relative is not None
        counts.append(h.prompt_counts[keep])
        starts.append(h.prompt_starts[keep] + ref_base)
        response = h.prompt_responses.astype(np.int64)
        responses.append(np.where(response >= 0, response + text_base, -1)[keep])
        relative.append(h.prompt_relative[keep].astype(np.uint8))
        refs.append(h.prompt_refs.astype(np.int64) + text_base)
        n_texts = int(h.texts.lengths.size)
        text_file.append(np.full(n_texts, file_id, dtype=np.int32))
        text_offset.append(h.texts.offsets)
        text_length.append(h.texts.lengths)
        text_crc.append(h.texts.crc)
        text_codec.append(h.texts.codec)
        text_base += n_texts
        ref_base += int(h.prompt_refs.size)
    all_refs = np.concatenate(refs) if refs else np.zeros(0, np.int64)
    # texts more than one step (or one step more than once) reads: parsed once, copied
    uses = np.bincount(all_refs, minlength=text_base) if text_base else np.zeros(0, np.int64)
    shared = (uses > 1).astype(np.uint8)

    def joined(parts: list[NDArray[Any]], dtype: Any) -> NDArray[Any]:
        out = np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
        return np.ascontiguousarray(out)

    # the narrowest integers that hold them (a million steps: 4 bytes each, not 8)
    wide_refs = np.int32 if ref_base < 2**31 else np.int64
    wide_texts = np.int32 if text_base < 2**31 else np.int64
    prompts = Prompts(
        {
            "counts": joined(counts, np.int32),
            "starts": joined(starts, wide_refs),
            "responses": joined(responses, wide_texts),
            "relative": joined(relative, np.uint8),
            "refs": joined([all_refs], np.int32),
            "text_file": joined(text_file, np.int32),
            "text_offset": joined(text_offset, np.int64),
            "text_length": joined(text_length, np.int32),
            "text_crc": joined(text_crc, np.uint32),
            "text_codec": joined(text_codec, np.uint8),
            "shared": shared,
        }
    )
    return prompts, _text_views(prompts, texts)


def _text_views(prompts: Prompts, texts: list[TextIndex | None]) -> list[TextIndex | None]:
    """Each file's text index as views of ``prompts``' joined arrays (one copy in memory)."""
    arrays, first = prompts.arrays, 0
    for file_id, index in enumerate(texts):
        if index is None:
            continue
        end = first + int(index.lengths.size)
        texts[file_id] = TextIndex(
            index.path,
            arrays["text_offset"][first:end],
            arrays["text_length"][first:end],
            arrays["text_crc"][first:end],
            arrays["text_codec"][first:end],
            index.end,
        )
        first = end
    return texts
