"""``replaystore blocklist list|remove|clear``: the sites a rollout's blocklist leaves out."""

from __future__ import annotations

import argparse
from pathlib import Path

from replaystore.cli._common import Parser, UsageError

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = (
    "Show or edit a blocklist (RUN/blocklist.jsonl): 'list' prints the blocked "
    "sites (scheme://host:port), 'remove SITE' deletes the entries of one site (a bare "
    "host: every entry of that host), 'clear' deletes every entry. Safe while rollouts "
    "run (the file is locked)."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore blocklist``."""
    parser.add_argument("action", choices=("list", "remove", "clear"))
    parser.add_argument("site", nargs="?", metavar="SITE", help="the site to remove (remove only)")
    parser.add_argument(
        "--file",
        required=True,
        metavar="PATH",
        help="the blocklist file, or the run directory that holds blocklist.jsonl",
    )
    parser.add_argument("--all", action="store_true", help="list: expired entries too")


def run(args: argparse.Namespace) -> int:
    """List, remove or clear blocklist entries; returns the exit status."""
    from replaystore.pipeline.blocklist import Blocklist, entry_site

    target = Path(args.file)
    if target.is_dir() and not (target / "blocklist.jsonl").exists():
        raise UsageError(f"{target} holds no blocklist.jsonl")
    if not target.is_dir() and not target.exists():
        raise UsageError(f"{target} does not exist")
    blocklist = Blocklist(target)
    if args.action == "list":
        entries = blocklist.entries(include_expired=args.all)
        for site in sorted({entry_site(e) for e in entries}):
            times = [e.get("blocked_at", "?") for e in entries if entry_site(e) == site]
            print(f"{site}\t{len(times)} entries, last {max(map(str, times))}")
        if not entries:
            print(f"no {'entries' if args.all else 'blocked sites'} in {blocklist.path}")
        return 0
    if args.action == "remove":
        if not args.site:
            raise UsageError("remove needs a SITE (as 'replaystore blocklist list' shows it)")
        try:
            removed = blocklist.remove(args.site)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(f"removed {removed} entries of {args.site} from {blocklist.path}")
        return 0
    if args.site:
        raise UsageError("clear takes no SITE")
    print(f"removed {blocklist.clear()} entries from {blocklist.path}")
    return 0
