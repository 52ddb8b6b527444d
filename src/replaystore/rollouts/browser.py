"""Chromium through Playwright: a bounded pool of reusable, isolated browser contexts.

Two ways to get a browser:

* **Local launch** (default): the system Chromium, found by :func:`find_chromium`
  (``REPLAYSTORE_CHROMIUM`` first, then the usual names on ``PATH``; for a headless
  launch Debian's ``chromium-headless-shell`` comes first, then ``chromium``), or the
  one Playwright manages (``playwright install chromium``) when there is no system
  browser.
* **Remote over CDP**: ``BrowserPool(cdp_urls=["http://farm-1:9222", ...])``
  connects to browsers that already run elsewhere (a browser farm started with
  ``chromium --headless --remote-debugging-port=9222``); contexts are spread over
  them round-robin.

Every task gets its own browser context (cookies, storage, cache isolated from
other tasks). Contexts are reused from a pool of at most ``size``: when a task
returns its context, its pages are closed and its cookies, permissions and the
storage of every origin it visited are cleared, so the next task starts clean
without paying for a new context; after ``max_uses`` tasks a context is replaced.

Needs the ``rollouts`` extra (``pip install 'replaystore[rollouts]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from replaystore.errors import ReplayStoreError

__all__ = [
    "CHROMIUM_ARGS",
    "INSTALL_HINT",
    "BrowserPool",
    "BrowserUnavailableError",
    "accessibility_tree",
    "find_chromium",
    "page_snapshot",
    "require_playwright",
]

logger = logging.getLogger("replaystore.rollouts.browser")

#: Flags for a headless Chromium in a container or CI (we run as root: no sandbox).
CHROMIUM_ARGS: tuple[str, ...] = (
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)

#: One line telling a user how to get a browser.
INSTALL_HINT = (
    "no Chromium found: install one (Debian/Ubuntu: sudo apt-get install "
    "chromium-headless-shell, or chromium) or set "
    "REPLAYSTORE_CHROMIUM=/path/to/chromium, or run `playwright install chromium`"
)

_RESET_TIMEOUT_S = 10.0
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: Chromium's headless shell (Debian's ``chromium-headless-shell``, the browser Playwright
#: itself launches for headless work): Chromium without its window system. A MiniWoB++
#: rollout of 30 episodes with 4 contexts on 2 cores took 20-21 s and 5 s of browser CPU
#: with it against 53-60 s and 16 s with ``chromium --headless`` (2026-11-28,
#: alternating, two runs each).
_HEADLESS_CANDIDATES = ("chromium-headless-shell",)


class BrowserUnavailableError(ReplayStoreError, RuntimeError):
    """No browser could be found, launched or connected to (the message says how to get one)."""


def require_playwright() -> Any:
    """The ``playwright.async_api`` module.

    Raises:
        ImportError: Playwright is missing (one line naming the extra to install).
    """
    try:
        import playwright.async_api as api
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise ImportError(
            "replaystore.rollouts needs Playwright: pip install 'replaystore[rollouts]'"
        ) from exc
    return api


def find_chromium(headless: bool = True) -> str | None:
    """Path of a Chromium to launch: ``$REPLAYSTORE_CHROMIUM``, else the first of
    chromium-headless-shell (only when ``headless``), chromium, chromium-browser,
    google-chrome(-stable) on ``PATH``; None if none.

    The headless shell is Chromium without its window system: a third of the browser CPU
    of ``chromium --headless`` per MiniWoB++ episode on 2 cores (2026-11-28).
    ``headless=False`` (a window to watch) skips it.

    Raises:
        BrowserUnavailableError: ``REPLAYSTORE_CHROMIUM`` is set but is not an
            executable file (a wrong setting is an error, not a silent fallback).
    """
    configured = os.environ.get("REPLAYSTORE_CHROMIUM", "").strip()
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BrowserUnavailableError(
                f"REPLAYSTORE_CHROMIUM={configured!r} is not an executable file"
            )
        return str(path)
    for name in (*_HEADLESS_CANDIDATES, *_CANDIDATES) if headless else _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass(slots=True)
class _Slot:
    """One pooled context and what must be cleared before it is reused."""

    context: Any
    browser: Any
    uses: int = 0
    origins: set[str] = field(default_factory=set)


class BrowserPool:
    """At most ``size`` isolated browser contexts, handed out one per task.

    Args:
        size: most contexts alive at once (= tasks that can run concurrently).
        executable_path: Chromium to launch (default: :func:`find_chromium`, then
            Playwright's own browser). Ignored with ``cdp_urls``.
        cdp_urls: connect to these running browsers over CDP instead of launching
            (``http://host:9222`` or ``ws://...`` endpoints).
        browser: a Playwright ``Browser`` that is already launched or connected
            (in the running event loop): the pool takes its contexts from it
            instead of launching one, and leaves it open on close (several pools
            can share one browser: no launch per pool).
        headless: launch without a window.
        viewport: ``(width, height)`` CSS pixels of every page; screenshots have
            this size and action coordinates refer to it.
        args: extra Chromium flags (appended to :data:`CHROMIUM_ARGS`).
        max_uses: tasks served by one context before it is closed and replaced.
        launch_timeout_s: limit for launching or connecting.

    Raises:
        ValueError: ``size < 1``, ``max_uses < 1``, a bad viewport, or both
            ``cdp_urls`` and ``browser``.

    Use ``async with BrowserPool(...) as pool:`` then ``async with pool.context()
    as ctx:`` per task. :meth:`start` raises :class:`BrowserUnavailableError`
    when no browser can be launched or reached.
    """

    def __init__(
        self,
        size: int = 4,
        *,
        executable_path: str | os.PathLike[str] | None = None,
        cdp_urls: Sequence[str] | None = None,
        browser: Any = None,
        headless: bool = True,
        viewport: tuple[int, int] = (1024, 768),
        args: Sequence[str] = (),
        max_uses: int = 50,
        launch_timeout_s: float = 30.0,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1, got {size!r}")
        if isinstance(max_uses, bool) or not isinstance(max_uses, int) or max_uses < 1:
            raise ValueError(f"max_uses must be an int >= 1, got {max_uses!r}")
        if len(viewport) != 2 or not all(isinstance(v, int) and 64 <= v <= 8192 for v in viewport):
            raise ValueError(f"viewport must be (width, height) ints in 64..8192, got {viewport!r}")
        if cdp_urls is not None and (isinstance(cdp_urls, str) or not list(cdp_urls)):
            raise ValueError("cdp_urls must be a non-empty list of CDP endpoint URLs")
        if browser is not None and cdp_urls is not None:
            raise ValueError("give cdp_urls or browser, not both")
        if browser is not None and not callable(getattr(browser, "new_context", None)):
            raise ValueError(f"browser must be a Playwright Browser, got {type(browser).__name__}")
        self._shared_browser = browser
        self.size = size
        self.executable_path = None if executable_path is None else os.fspath(executable_path)
        self.cdp_urls = None if cdp_urls is None else [str(u) for u in cdp_urls]
        self.headless = headless
        self.viewport = (int(viewport[0]), int(viewport[1]))
        self.args = (*CHROMIUM_ARGS, *args)
        self.max_uses = max_uses
        self.launch_timeout_s = float(launch_timeout_s)
        self._playwright: Any = None
        self._browsers: list[Any] = []
        self._idle: list[_Slot] = []
        self._slots: asyncio.Semaphore | None = None  # created in start(), inside the loop
        self._next_browser = 0
        self._started = False
        #: Contexts created / reused so far (for tests and benchmarks).
        self.created = 0
        self.reused = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def browser_version(self) -> str:
        """Version string of the first browser (empty before :meth:`start`)."""
        return self._browsers[0].version if self._browsers else ""

    async def start(self) -> BrowserPool:
        """Launch the local browser or connect to the CDP endpoints (idempotent).

        Raises:
            BrowserUnavailableError: no browser to launch, the launch failed, or an
                endpoint cannot be reached (names the path or URL).
            ImportError: Playwright is not installed.
        """
        if self._started:
            return self
        self._slots = asyncio.Semaphore(self.size)
        if self._shared_browser is not None:
            if not self._shared_browser.is_connected():
                raise BrowserUnavailableError("the browser given to BrowserPool is not connected")
            self._browsers.append(self._shared_browser)
            self._started = True
            return self
        api = require_playwright()
        self._playwright = await api.async_playwright().start()
        try:
            if self.cdp_urls is not None:
                for url in self.cdp_urls:
                    try:
                        browser = await self._playwright.chromium.connect_over_cdp(
                            url, timeout=self.launch_timeout_s * 1000.0
                        )
                    except api.Error as exc:
                        raise BrowserUnavailableError(
                            f"cannot connect to the browser at {url} over CDP: "
                            f"{str(exc).strip().splitlines()[0]}"
                        ) from None
                    self._browsers.append(browser)
                logger.info("connected to %d browser(s) over CDP", len(self._browsers))
            else:
                path = self.executable_path or find_chromium(self.headless)
                if path is None and not Path(self._playwright.chromium.executable_path).exists():
                    raise BrowserUnavailableError(INSTALL_HINT)
                try:
                    browser = await self._playwright.chromium.launch(
                        executable_path=path,
                        headless=self.headless,
                        args=list(self.args),
                        timeout=self.launch_timeout_s * 1000.0,
                        # Ctrl-C is the collector's: a terminal sends it to the whole
                        # process group, and Playwright's driver would close the browser
                        # under the running tasks and drop its connection ("Connection
                        # closed while reading from the driver").
                        handle_sigint=False,
                    )
                except api.Error as exc:
                    raise BrowserUnavailableError(
                        f"cannot launch Chromium ({path or 'Playwright-managed'}): "
                        f"{str(exc).strip().splitlines()[0]}"
                    ) from None
                self._browsers.append(browser)
                logger.info("launched Chromium %s (%s)", browser.version, path or "Playwright")
        except BaseException:
            await self._shutdown()
            raise
        self._started = True
        return self

    async def close(self) -> None:
        """Close every context and the launched browser (CDP browsers are only
        disconnected from, a ``browser`` given to the pool is left open: they
        belong to someone else). Idempotent."""
        await self._shutdown()

    async def _shutdown(self) -> None:
        for slot in self._idle:
            with contextlib.suppress(Exception):
                await slot.context.close()
        self._idle.clear()
        for browser in self._browsers:
            if browser is self._shared_browser:
                continue  # someone else's: left open
            with contextlib.suppress(Exception):
                await browser.close()
        self._browsers.clear()
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                await self._playwright.stop()
            self._playwright = None
        self._started = False

    async def __aenter__(self) -> BrowserPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ contexts

    async def _new_slot(self) -> _Slot:
        browser = self._browsers[self._next_browser % len(self._browsers)]
        self._next_browser += 1
        context = await browser.new_context(
            viewport={"width": self.viewport[0], "height": self.viewport[1]},
            device_scale_factor=1,
        )
        self.created += 1
        return _Slot(context, browser)

    async def _reset(self, slot: _Slot) -> bool:
        """Clear what the last task left in ``slot``; False when it must be replaced."""
        try:
            async with asyncio.timeout(_RESET_TIMEOUT_S):
                await self._clear(slot)
        except Exception as exc:  # a crashed or stuck context is replaced, not reused
            logger.info("browser context not reused (%s); replacing it", exc or repr(exc))
            return False
        slot.origins.clear()
        return True

    async def _clear(self, slot: _Slot) -> None:
        context = slot.context
        if any(page.url.startswith("chrome-error:") for page in context.pages):
            # Closing Chromium's error page can hang: such a context is replaced.
            raise RuntimeError("the context shows a network error page")
        pages = list(context.pages)
        for page in pages:
            _remember_origin(slot, page.url)
        if slot.origins:
            # Storage (localStorage, IndexedDB, cache...) is per origin: clear each one
            # visited, through a page the task left open (a new page costs a renderer).
            if not pages:
                pages.append(await context.new_page())
            session = await context.new_cdp_session(pages[0])
            for origin in sorted(slot.origins):
                await session.send(
                    "Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"}
                )
            await session.detach()
        for page in pages:
            await page.close()
        await context.clear_cookies()
        await context.clear_permissions()

    @contextlib.asynccontextmanager
    async def context(self) -> AsyncIterator[Any]:
        """A clean browser context for one task, returned to the pool on exit.

        Waits while ``size`` contexts are in use. Pages the task opens are closed,
        and the context's cookies and per-origin storage cleared, when it is returned.

        Raises:
            RuntimeError: the pool is not started.
        """
        if not self._started or self._slots is None:
            raise RuntimeError("BrowserPool is not started: use `async with BrowserPool(...)`")
        async with self._slots:
            if self._idle:
                slot = self._idle.pop()
                self.reused += 1
            else:
                slot = await self._new_slot()
            slot.uses += 1

            def on_navigate(frame: Any) -> None:
                _remember_origin(slot, frame.url)

            def on_page(page: Any) -> None:
                page.on("framenavigated", on_navigate)

            slot.context.on("page", on_page)
            try:
                yield slot.context
            finally:
                slot.context.remove_listener("page", on_page)
                # Shielded: a cancelled task (timeout, Ctrl-C) still returns a clean context.
                await asyncio.shield(self._give_back(slot))

    async def _give_back(self, slot: _Slot) -> None:
        reusable = slot.uses < self.max_uses and self._started and await self._reset(slot)
        if reusable:
            self._idle.append(slot)
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_RESET_TIMEOUT_S):
                await slot.context.close()

    async def new_page(self, context: Any) -> Any:
        """A page in ``context`` (the viewport is the pool's)."""
        return await context.new_page()


def _remember_origin(slot: _Slot, url: str) -> None:
    parts = urlsplit(url or "")
    if parts.scheme in ("http", "https") and parts.netloc:
        slot.origins.add(f"{parts.scheme}://{parts.netloc}")


# A browser-side walk over the visible interactive elements: one line per element,
# "[i] role 'name' @(cx,cy)" with the centre in viewport (= screenshot) pixels.
_AC_TREE_JS = r"""
() => {
  const sel = 'a[href],button,input:not([type=hidden]),select,textarea,summary,' +
              '[role=button],[role=link],[role=checkbox],[role=tab],[onclick]';
  const implicit = (el) => {
    const tag = el.tagName.toLowerCase();
    if (tag === 'a') return 'link';
    if (tag === 'button' || tag === 'summary') return 'button';
    if (tag === 'select') return 'combobox';
    if (tag === 'textarea') return 'textbox';
    if (tag === 'input') {
      const t = (el.getAttribute('type') || 'text').toLowerCase();
      if (['submit', 'button', 'reset', 'image'].includes(t)) return 'button';
      if (t === 'checkbox' || t === 'radio') return t;
      if (t === 'search') return 'searchbox';
      return 'textbox';
    }
    return 'generic';
  };
  const label = (el) => {
    const aria = el.getAttribute('aria-label');
    if (aria) return aria;
    if (el.labels && el.labels.length) return el.labels[0].innerText;
    const text = (el.innerText || '').trim();
    if (text) return text;
    return el.getAttribute('placeholder') || el.value || el.getAttribute('title') ||
           el.getAttribute('alt') || el.getAttribute('name') || '';
  };
  const w = window.innerWidth, h = window.innerHeight;
  const out = [];
  for (const el of document.querySelectorAll(sel)) {
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1 || r.bottom <= 0 || r.right <= 0 || r.top >= h || r.left >= w)
      continue;
    const st = getComputedStyle(el);
    if (st.visibility === 'hidden' || st.display === 'none' || Number(st.opacity) === 0) continue;
    const cx = Math.round(Math.min(Math.max(r.left + r.width / 2, 0), w - 1));
    const cy = Math.round(Math.min(Math.max(r.top + r.height / 2, 0), h - 1));
    const name = label(el).replace(/\s+/g, ' ').trim().slice(0, 80).replace(/'/g, "\u2019");
    const role = el.getAttribute('role') || implicit(el);
    out.push(`[${out.length + 1}] ${role} '${name}' @(${cx},${cy})`);
  }
  return out.join('\n');
}
"""


async def accessibility_tree(page: Any) -> str:
    """The visible interactive elements of ``page``, one per line.

    Format: ``[i] role 'accessible name' @(cx,cy)``: ``i`` counts from 1,
    ``role`` is the ARIA role (explicit or implied by the tag: link, button,
    textbox, searchbox, checkbox, radio, combobox), the name is what a screen
    reader announces (aria-label, label, text, placeholder...; at most 80
    characters, ``'`` written as ``’``), and ``(cx, cy)`` is the element's
    centre in screenshot pixels, clamped to the viewport. Elements outside the
    viewport or hidden are left out.

    Cost: one script evaluation in the page (about a millisecond for a small page).
    """
    return str(await page.evaluate(_AC_TREE_JS))


#: Markup and scripts of known anti-bot challenges (reCAPTCHA, hCaptcha, Cloudflare).
CHALLENGE_SELECTOR = ", ".join(
    (
        ".g-recaptcha",
        ".h-captcha",
        ".cf-turnstile",
        "#challenge-form",
        "#cf-challenge-running",
        "#challenge-running",
        "iframe[src*='recaptcha']",
        "iframe[src*='hcaptcha.com']",
        "iframe[src*='challenges.cloudflare.com']",
        "script[src*='recaptcha/api']",
        "script[src*='hcaptcha.com']",
        "script[src*='challenges.cloudflare.com']",
    )
)

_SNAPSHOT_JS = (
    "() => { const c = document.querySelector(" + repr(CHALLENGE_SELECTOR) + "); "
    "return {tree: (" + _AC_TREE_JS.strip() + ")(), title: document.title, "
    "text: (document.body ? document.body.innerText : '').slice(0, 2000), "
    "challenge: c ? (c.id ? '#' + c.id : c.tagName.toLowerCase() + "
    "(c.className ? '.' + String(c.className).split(' ')[0] : '')) : ''}; }"
)


async def page_snapshot(page: Any) -> dict[str, str]:
    """``{"tree", "title", "text", "challenge"}`` of ``page`` in one round trip: the
    :func:`accessibility_tree`, the title, the first 2000 characters of the
    visible text, and the first element matching :data:`CHALLENGE_SELECTOR`
    (``""`` when none; what anti-bot detection reads with the text)."""
    value = await page.evaluate(_SNAPSHOT_JS)
    return {k: str(value.get(k) or "") for k in ("tree", "title", "text", "challenge")}
