"""``replaystore export STORE --out DIR``: a LLaMA-Factory dataset from a trajectory storage."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from replaystore.cli._common import (
    Parser,
    UsageError,
    finite_float,
    int_at_least,
    progress,
    ratio,
    store_path,
)

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = (
    "Open the trajectory storage STORE as a replay buffer, draw samples "
    "(recency-biased when --num-samples is below what is available) and write a "
    "LLaMA-Factory dataset in --out: the records, an optional validation split and "
    "dataset_info.json. Steps without a stored prompt get one from the default "
    "ConversationBuilder. --format kto writes every step of successful and failed "
    "trajectories tagged desirable or not; --format dpo writes chosen/rejected pairs at "
    "states reached by both (docs/cli.md says how pairs are made)."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore export``."""
    parser.add_argument("store", metavar="STORE", help="trajectory storage directory")
    parser.add_argument("--out", required=True, help="dataset directory (created if missing)")
    parser.add_argument(
        "--format",
        choices=("sharegpt", "openai", "kto", "dpo"),
        default="sharegpt",
        help="record format: SFT records (sharegpt, openai) or preference records in "
        "sharegpt form (kto: every step tagged by its trajectory's success; dpo: pairs "
        "at shared states) (default: %(default)s)",
    )
    parser.add_argument(
        "--num-samples",
        type=int_at_least(0),
        default=None,
        help="how many samples (default: all available)",
    )
    parser.add_argument(
        "--recency-bias-power",
        type=finite_float,
        default=1.0,
        help="weight (rank+1)**P by recency; 1.0 draws uniformly (default: %(default)s)",
    )
    parser.add_argument(
        "--val-ratio",
        type=ratio,
        default=0.0,
        help="share of records for a validation split, in [0, 1) (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of sampling and shuffle (default: %(default)s)"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--filter-successful-only",
        dest="all",
        action="store_false",
        help="only training-eligible steps: successful trajectories, changed screenshots (default)",
    )
    which.add_argument(
        "--all",
        dest="all",
        action="store_true",
        help="every step, successful or not",
    )
    parser.set_defaults(all=False)
    parser.add_argument(
        "--keep-same-screenshot",
        action="store_true",
        help="keep steps whose screenshot equals the next one's (filtered by default)",
    )
    parser.add_argument(
        "--last-n-iterations",
        type=int_at_least(1),
        default=None,
        help="only the most recent N iterations (default: all)",
    )
    parser.add_argument(
        "--dataset-name",
        default="replaystore",
        help="entry name in dataset_info.json and file stem (default: %(default)s)",
    )
    parser.add_argument(
        "--file-format",
        choices=("json", "jsonl"),
        default="json",
        help="one JSON array or JSON lines (default: %(default)s)",
    )
    parser.add_argument(
        "--copy-images",
        action="store_true",
        help="copy screenshots into OUT/images (a self-contained dataset); default: "
        "reference them by absolute path",
    )
    parser.add_argument(
        "--image-root",
        metavar="DIR",
        default=None,
        help="refuse screenshots that resolve outside DIR (symlinks and '..' followed), e.g. "
        "the storage's parent for trajectories you did not write; default: no restriction",
    )
    parser.add_argument(
        "--history-window",
        type=int_at_least(0),
        default=4,
        help="previous steps shown in full in rebuilt prompts (default: %(default)s)",
    )
    parser.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="a sample that cannot be exported: fail and write nothing, or leave it out "
        "(default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Sample the trajectory storage, write the LLaMA-Factory dataset; returns the exit status."""
    from replaystore.experience.storage.urls import is_postgres_url

    if is_postgres_url(args.store):  # before the trajectory imports (torch): fail fast
        raise UsageError(
            f"{args.store} is an experience store; export reads a trajectory storage "
            "directory (copy an experience store with: replaystore copy SRC DST)"
        )
    from replaystore.trajectories import TrajectoryBuffer, TrajectoryStorage
    from replaystore.trajectories.context import ConversationBuilder

    store = store_path(args.store)
    if not store.is_dir():
        raise UsageError(f"{store} is not a directory (expected a trajectory storage)")
    if not TrajectoryStorage(store).files():
        raise UsageError(f"{store} holds no trajectory iteration files (iteration_*.jsonl)")
    if args.format in ("kto", "dpo"):
        return _run_preference(args, store)
    buffer = TrajectoryBuffer.from_storage(
        store,
        last_n_iterations=args.last_n_iterations,
        agent=ConversationBuilder(history_window=args.history_window),
        filter_successful_only=not args.all,
        filter_same_screenshot=not args.keep_same_screenshot,
        seed=args.seed,
    )
    # --all: every kept step, successful or not (e.g. for reward-aware training).
    chosen = buffer.get_training_samples(
        args.num_samples,
        recency_bias_power=args.recency_bias_power,
        seed=args.seed,
        eligible_only=not args.all,
    )
    pool = len(buffer) if args.all else buffer.num_eligible
    what = "samples" if args.all else "training-eligible samples"
    # Materialise each sample (parse or build its prompt) under the progress bar.
    read = iter(chosen)
    samples = list(progress(read, len(chosen), "reading samples"))
    report = _export(args, samples, format=args.format)
    stats = buffer.stats
    print(
        f"exported {report.num_train} train + {report.num_val} validation records "
        f"({args.format}) from {len(samples)} of {pool} {what} "
        f"({stats.samples} steps, {stats.trajectories} trajectories in {store})"
    )
    _print_files(report)
    if args.copy_images or report.images_written:
        where = f"{report.images_written} new files in {report.out_dir / 'images'}"
    else:
        where = "screenshots referenced by absolute path"
    print(f"  images:       {report.num_image_refs} references ({where})")
    if report.rejected:
        print(f"  rejected:     {len(report.rejected)} samples (listed in the log)")
    return 0


#: Options of the SFT export that do not apply to preference records, with their defaults.
_SFT_ONLY = {
    "num_samples": ("--num-samples", None),
    "recency_bias_power": ("--recency-bias-power", 1.0),
    "all": ("--all", False),
    "keep_same_screenshot": ("--keep-same-screenshot", False),
    "history_window": ("--history-window", 4),
}


def _run_preference(args: argparse.Namespace, store: Path) -> int:
    """``--format kto|dpo``: every step of successes and failures, or pairs at shared states."""
    from replaystore.errors import ExportError
    from replaystore.trajectories import TrajectoryStorage
    from replaystore.trajectories.preference import (
        dpo_pairs,
        kto_samples,
        preference_steps,
        storage_trajectories,
    )

    for dest, (option, default) in _SFT_ONLY.items():
        if getattr(args, dest) != default:
            raise UsageError(
                f"{option} is for SFT exports; --format {args.format} uses every step of "
                "every trajectory, with the prompts stored at rollout"
            )
    trajectories = storage_trajectories(TrajectoryStorage(store), args.last_n_iterations)
    steps = preference_steps(progress(trajectories, None, "reading", unit="trajectory"))
    good = sum(s.success for s in steps)
    if args.format == "kto":
        samples = kto_samples(steps)
        made = (
            f"{len(steps)} steps ({good} of successful trajectories, tagged desirable; "
            f"{len(steps) - good} of failed ones, undesirable)"
        )
    else:
        samples, pairs = dpo_pairs(steps)
        made = (
            f"{pairs.pairs} pairs at {pairs.states_with_pairs} of {pairs.states} states "
            f"(no pair: {pairs.only_successful} reached only by successful trajectories, "
            f"{pairs.only_failed} only by failed ones, {pairs.same_actions} where the "
            "failures took the successes' actions)"
        )
        if not samples:
            raise ExportError(
                f"no DPO pairs in {store}: {made}. A pair needs a successful and a failed "
                "attempt that reached the same state (task and prompt): repeated attempts "
                "at the same task instances make them"
            )
    report = _export(args, samples, kind=args.format)
    print(
        f"exported {report.num_train} train + {report.num_val} validation {args.format.upper()} "
        f"records from {made} in {store}"
    )
    _print_files(report)
    if report.rejected:
        print(f"  rejected:     {len(report.rejected)} samples (listed in the log)")
    return 0


def _print_files(report: Any) -> None:
    """The lines naming an export's record files and its ``dataset_info.json`` entries."""
    print(f"  records:      {report.train_file}")
    if report.val_file is not None:
        print(f"  validation:   {report.val_file}")
    entries = [report.dataset_name] + ([f"{report.dataset_name}_val"] if report.val_file else [])
    print(f"  dataset_info: {report.dataset_info_file} (entries: {', '.join(entries)})")


def _export(
    args: argparse.Namespace, samples: list[Any], *, format: Any = "sharegpt", kind: Any = "sft"
) -> Any:
    """``export_llamafactory`` of ``samples`` with the command's output options:
    ``format`` the record layout (SFT), ``kind`` ``sft``, ``kto`` or ``dpo``."""
    from replaystore.trajectories.export import export_llamafactory

    return export_llamafactory(
        samples,
        Path(args.out),
        dataset_name=args.dataset_name,
        val_ratio=args.val_ratio,
        seed=args.seed,
        file_format=args.file_format,
        copy_images=args.copy_images,
        on_error=args.on_error,
        image_root=args.image_root,
        format=format,
        kind=kind,
    )
