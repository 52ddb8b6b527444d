"""Blocklist: domain normalisation, expiry, and a JSONL file shared by many processes."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from replaystore.pipeline.blocklist import (
    Blocklist,
    blocked_domain_set,
    normalize_domain,
    normalize_site,
)
from replaystore.pipeline.blocklist_manager import BlocklistManager

HOUR = 3600.0


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def read_lines(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize(
    ("url", "domain"),
    [
        ("https://example.com/a/b?q=1#frag", "example.com"),
        ("http://www.example.com", "example.com"),
        ("HTTPS://WWW.EXAMPLE.COM/", "example.com"),
        ("https://example.com:8443/x", "example.com"),
        ("example.com:8080/path", "example.com"),
        ("example.com", "example.com"),
        ("  Example.Com  ", "example.com"),
        ("https://example.com./", "example.com"),
        ("https://user:secret@www.example.com/", "example.com"),
        ("ftp://user@Shop.Example.com", "shop.example.com"),
        ("https://www.shop.example.co.uk", "shop.example.co.uk"),
        ("https://www.com", "www.com"),
        ("http://localhost:8000/index.html", "localhost"),
        ("http://127.0.0.1:5000/", "127.0.0.1"),
        ("http://[::1]:8080/", "::1"),
        ("https://bücher.de/katalog", "xn--bcher-kva.de"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
    ],
)
def test_normalize_domain_table(url: str, domain: str) -> None:
    assert normalize_domain(url) == domain


@pytest.mark.parametrize("url", ["", "   ", "https://", "/just/a/path"])
def test_normalize_domain_rejects_urls_without_host(url: str) -> None:
    with pytest.raises(ValueError, match="host"):
        normalize_domain(url)


def test_record_stores_domain_task_screenshot_and_timestamp(tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.0)
    blocklist = Blocklist(tmp_path / "b.jsonl", clock=clock)
    blocklist.record_blocked_website(
        "https://www.Shop.com/cart", task_id="t7", screenshot_path="s.png"
    )
    (entry,) = read_lines(tmp_path / "b.jsonl")
    assert entry["domain"] == "shop.com"
    assert entry["url"] == "https://www.Shop.com/cart"
    assert entry["task_id"] == "t7"
    assert entry["screenshot_path"] == "s.png"
    assert entry["timestamp"] == 1_700_000_000.0
    assert entry["blocked_at"] == "2023-11-14T22:13:20+00:00"


def test_entry_blocks_until_duration_has_passed(tmp_path: Path) -> None:
    clock = FakeClock()
    blocklist = Blocklist(tmp_path / "b.jsonl", block_duration_hours=2, clock=clock)
    blocklist.record_blocked_website("https://example.com/")
    clock.now += 2 * HOUR - 1e-3
    assert blocklist.is_website_blocked("example.com")
    clock.now += 1e-3
    assert not blocklist.is_website_blocked("example.com")
    assert blocklist.get_blocked_domains() == set()


def test_a_later_entry_extends_the_block(tmp_path: Path) -> None:
    clock = FakeClock()
    blocklist = Blocklist(tmp_path / "b.jsonl", block_duration_hours=1, clock=clock)
    blocklist.record_blocked_website("example.com")
    clock.now += 0.5 * HOUR
    blocklist.record_blocked_website("example.com")
    clock.now += 0.75 * HOUR
    assert blocklist.is_website_blocked("example.com")
    assert blocklist.stats()["expired_entries"] == 1


def test_url_variants_of_a_blocked_site_are_blocked(tmp_path: Path) -> None:
    blocklist = Blocklist(tmp_path / "b.jsonl")
    blocklist.record_blocked_website("https://www.example.com/login")
    for url in ["example.com", "https://EXAMPLE.com:443/x", "https://user@www.example.com./"]:
        assert blocklist.is_website_blocked(url), url
    assert "https://example.com" in blocklist
    assert not blocklist.is_website_blocked("http://example.com/")  # port 80: another site


def test_subdomains_are_blocked_only_when_asked_and_never_parents(tmp_path: Path) -> None:
    blocklist = Blocklist(tmp_path / "b.jsonl")
    blocklist.record_blocked_website("https://example.com/")
    assert not blocklist.is_website_blocked("https://m.example.com/")
    blocklist.record_blocked_website("https://example.com/", subdomains=True)
    blocklist.record_blocked_website("https://shop.other.org/")
    assert blocklist.is_website_blocked("https://m.example.com/")
    assert blocklist.is_website_blocked("a.b.example.com")
    assert not blocklist.is_website_blocked("badexample.com")
    assert blocklist.is_website_blocked("shop.other.org")
    assert not blocklist.is_website_blocked("other.org")
    assert not blocklist.is_website_blocked("news.other.org")


def test_missing_file_is_an_empty_blocklist(tmp_path: Path) -> None:
    blocklist = Blocklist(tmp_path / "sub" / "b.jsonl")
    assert blocklist.get_blocked_domains() == set()
    assert blocklist.stats()["total_entries"] == 0
    assert blocklist.clean_expired_entries() == 0
    assert not blocklist.path.exists()


def test_directory_path_uses_webgym_file_name(tmp_path: Path) -> None:
    manager = BlocklistManager(tmp_path)
    manager.record_blocked_website("https://example.com")
    assert Path(manager.blocklist_file) == tmp_path / "blocklist.jsonl"
    assert manager.get_blocklist_stats()["blocked_domains"] == ["example.com"]


def test_rejects_non_positive_duration(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="block_duration_hours"):
        Blocklist(tmp_path / "b.jsonl", block_duration_hours=0)


def test_clean_expired_rewrites_file_with_unexpired_entries_only(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "b.jsonl"
    blocklist = Blocklist(path, block_duration_hours=1, clock=clock)
    blocklist.record_blocked_website("old.com")
    clock.now += 0.9 * HOUR
    blocklist.record_blocked_website("new.com")
    os.chmod(path, 0o640)
    clock.now += 0.2 * HOUR
    assert blocklist.clean_expired_entries() == 1
    assert [e["domain"] for e in read_lines(path)] == ["new.com"]
    assert path.stat().st_mode & 0o777 == 0o640
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_clean_expired_leaves_file_alone_when_nothing_expired(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    blocklist = Blocklist(path)
    blocklist.record_blocked_website("a.com")
    inode = path.stat().st_ino
    assert blocklist.clean_expired_entries() == 0
    assert path.stat().st_ino == inode


def test_torn_final_line_is_skipped_then_cleaned(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    blocklist = Blocklist(path)
    blocklist.record_blocked_website("a.com")
    with open(path, "ab") as handle:
        handle.write(b'{"domain": "torn.com", "timest')
    assert blocklist.get_blocked_domains() == {"a.com"}
    blocklist.clean_expired_entries()
    assert [e["domain"] for e in read_lines(path)] == ["a.com"]


def test_unreadable_line_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "b.jsonl"
    blocklist = Blocklist(path)
    blocklist.record_blocked_website("a.com")
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("not json\n")
    blocklist.record_blocked_website("b.com")
    with caplog.at_level(logging.WARNING, logger="replaystore.pipeline.blocklist"):
        assert blocklist.get_blocked_domains() == {"a.com", "b.com"}
    assert "line 2" in caplog.text


def test_reads_webgym_entries_with_naive_local_blocked_at(tmp_path: Path) -> None:
    path = tmp_path / "blocklist.jsonl"
    recent = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - HOUR))
    old = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 13 * HOUR))
    path.write_text(
        json.dumps({"domain": "recent.com", "url": "https://recent.com", "blocked_at": recent})
        + "\n"
        + json.dumps({"domain": "old.com", "url": "https://old.com", "blocked_at": old})
        + "\n",
        encoding="utf-8",
    )
    assert Blocklist(tmp_path).get_blocked_domains() == {"recent.com"}


def test_stats_counts_entries_and_blocked_domains(tmp_path: Path) -> None:
    clock = FakeClock()
    blocklist = Blocklist(tmp_path / "b.jsonl", block_duration_hours=1, clock=clock)
    blocklist.record_blocked_website("gone.com")
    clock.now += 2 * HOUR
    blocklist.record_blocked_website("b.com")
    blocklist.record_blocked_website("a.com")
    blocklist.record_blocked_website("https://www.a.com/x")
    assert blocklist.stats() == {
        "total_entries": 4,
        "currently_blocked": 2,
        "expired_entries": 1,
        "blocked_domains": ["a.com", "b.com"],
        "blocked_sites": ["a.com", "b.com", "https://a.com:443"],
    }


def test_blocked_domain_set_normalises_plain_collections(tmp_path: Path) -> None:
    assert blocked_domain_set(["https://www.A.com/x", "b.org"]) == {"a.com", "b.org"}
    assert blocked_domain_set(None) == frozenset()
    with pytest.raises(TypeError):
        blocked_domain_set("a.com")


# -- several processes ---------------------------------------------------------------------

LONG = "x" * 3000  # long lines make an interleaved write visible as broken JSON


def _append_many(path: str, worker: int, count: int) -> None:
    blocklist = Blocklist(path)
    for i in range(count):
        blocklist.record_blocked_website(
            f"https://w{worker}-{i}.example.org/", task_id=f"{worker}-{i}", screenshot_path=LONG
        )


def _spawn(target, args_list):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    for proc in procs:
        proc.start()
    return procs


def _join(procs) -> None:
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0


def test_concurrent_appends_from_four_processes_are_all_kept_whole(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    count = 250
    _join(_spawn(_append_many, [(str(path), w, count) for w in range(4)]))
    entries = read_lines(path)  # every line parses
    assert len(entries) == 4 * count
    assert {e["task_id"] for e in entries} == {f"{w}-{i}" for w in range(4) for i in range(count)}
    assert all(e["screenshot_path"] == LONG for e in entries)


def test_clean_expired_racing_with_appends_loses_no_unexpired_entry(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    stale = Blocklist(path, clock=lambda: time.time() - 48 * HOUR)
    cleaner = Blocklist(path)
    count = 200
    procs = _spawn(_append_many, [(str(path), w, count) for w in range(3)])
    stale_written = removed = rewrites_during_appends = 0
    while any(proc.is_alive() for proc in procs):
        # One expired entry per round, so every clean really rewrites the file.
        stale.record_blocked_website(f"https://stale{stale_written}.com/")
        stale_written += 1
        removed += cleaner.clean_expired_entries()
        rewrites_during_appends += 0 < len(cleaner.entries()) < 3 * count
    _join(procs)
    removed += cleaner.clean_expired_entries()
    entries = read_lines(path)
    assert rewrites_during_appends > 0
    assert removed == stale_written
    assert {e["task_id"] for e in entries} == {f"{w}-{i}" for w in range(3) for i in range(count)}
    assert len(entries) == 3 * count


# -- sites: scheme, host and port (issue 23, item 3) -----------------------------------------


@pytest.mark.parametrize(
    ("url", "site"),
    [
        ("http://localhost:18432/forbidden", "http://localhost:18432"),
        ("https://WWW.Example.com/a?q", "https://example.com:443"),
        ("http://shop.localhost/", "http://shop.localhost:80"),
        ("http://[::1]:8080/", "http://[::1]:8080"),
        ("example.com:8080", "example.com:8080"),
    ],
)
def test_normalize_site_keeps_scheme_host_and_port(url: str, site: str) -> None:
    assert normalize_site(url) == site


def test_one_wall_on_one_port_blocks_only_that_site(tmp_path: Path) -> None:
    blocklist = Blocklist(tmp_path / "b.jsonl")
    entry = blocklist.record_blocked_website("http://localhost:18432/forbidden")
    assert entry["site"] == "http://localhost:18432" and entry["domain"] == "localhost"
    assert blocklist.is_website_blocked("http://localhost:18432/other")
    for url in [
        "http://localhost:5000/",
        "http://shop.localhost:1234/",
        "http://127.0.0.1:5000/",
        "http://shop.localhost:18432/",
    ]:
        assert not blocklist.is_website_blocked(url), url
    assert blocklist.get_blocked_sites() == ["http://localhost:18432"]


def test_an_old_host_only_entry_still_blocks_every_port_and_subdomain(tmp_path: Path) -> None:
    path = tmp_path / "blocklist.jsonl"
    path.write_text(json.dumps({"domain": "localhost", "timestamp": 1e12}) + "\n")
    blocklist = Blocklist(path, clock=lambda: 1e12)
    assert blocklist.is_website_blocked("http://localhost:5000/")
    assert blocklist.is_website_blocked("http://shop.localhost:1234/")
    assert not blocklist.is_website_blocked("http://127.0.0.1:5000/")


def test_remove_deletes_one_site_and_clear_deletes_all(tmp_path: Path) -> None:
    blocklist = Blocklist(tmp_path / "b.jsonl")
    blocklist.record_blocked_website("http://localhost:18432/x")
    blocklist.record_blocked_website("http://localhost:18432/y")
    blocklist.record_blocked_website("http://localhost:5000/")
    assert blocklist.remove("http://localhost:18432") == 2
    assert blocklist.get_blocked_sites() == ["http://localhost:5000"]
    assert blocklist.remove("http://localhost:18432") == 0
    blocklist.record_blocked_website("https://example.com/")
    assert blocklist.remove("example.com") == 1  # a bare host: all its entries
    assert blocklist.clear() == 1
    assert blocklist.entries(include_expired=True) == []
