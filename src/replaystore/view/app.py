"""The Starlette application behind ``replaystore view``.

Routes by store kind (every page is server-rendered HTML; charts are inline SVG):

trajectory storage
    ``/`` overview; ``/trajectories`` filtered, paged list; ``/trajectory/{id}?step=N``
    one step; ``/screenshot/{id}/{step}`` that step's screenshot file.
experience store
    ``/`` tasks (paged); ``/rows`` filtered, paged rows; ``/row/{id}`` one row as JSON.
transitions checkpoint or memmap directory
    ``/`` schema, fill and histograms.

Safety: a request never writes anything; a screenshot is served only when its
real path (symbolic links and ``..`` resolved) lies inside the image root (by
default the store's directory); a bad parameter gets a 4xx HTML page saying
which one and why; an unexpected error gets a 500 page with one line (the
traceback goes to the log, never to the page); with ``allowed_hosts``, a request
whose Host header names no allowed host gets a one-line 400 (DNS rebinding: a web
page that rebinds its own domain to 127.0.0.1 would otherwise read the store
through the visitor's browser).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from replaystore.errors import QueryError, ReplayStoreError
from replaystore.redaction import redact
from replaystore.trajectories.context import display_url
from replaystore.view import svg
from replaystore.view.experience import FILTER_OPS, ExperienceReader, condition_from_form, row_json
from replaystore.view.trajectories import TrajectoryFilter, TrajectoryIndex
from replaystore.view.transitions import read_transitions

__all__ = ["KINDS", "build_app"]

logger = logging.getLogger("replaystore.view")

#: Store kinds the viewer opens (the names ``replaystore stats --json`` reports).
KINDS = (
    "trajectory_storage",
    "sqlite_experience_store",
    "postgres_experience_store",
    "transitions_checkpoint",
    "transitions_memmap",
)
_HERE = Path(__file__).parent
_IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".webp": "image/webp",
    ".gif": "image/gif",
}
PAGE_SIZES = (10, 25, 50, 100, 200)


# --------------------------------------------------------------------------- parameters


def _bad(message: str, status: int = 400) -> HTTPException:
    return HTTPException(status_code=status, detail=message)


def _int(
    request: Request, name: str, default: int | None, low: int, high: int | None = None
) -> Any:
    text = request.query_params.get(name, "").strip()
    if text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise _bad(f"parameter {name!r} must be an integer, got {text[:40]!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise _bad(f"parameter {name!r} must be {bound}, got {value}")
    return value


def _float(request: Request, name: str) -> float | None:
    text = request.query_params.get(name, "").strip()
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise _bad(f"parameter {name!r} must be a number, got {text[:40]!r}") from None
    if not math.isfinite(value):
        raise _bad(f"parameter {name!r} must be finite, got {text[:40]!r}")
    return value


def _bool(request: Request, name: str) -> bool | None:
    text = request.query_params.get(name, "").strip().lower()
    if text in ("", "any"):
        return None
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise _bad(f"parameter {name!r} must be yes, no or any, got {text[:40]!r}")


def _choice(request: Request, name: str, choices: list[str]) -> str | None:
    text = request.query_params.get(name, "")
    if text == "":
        return None
    if text not in choices:
        raise _bad(f"parameter {name!r}: unknown value {text[:60]!r}")
    return text


def _paging(request: Request, total: int, default_size: int = 25) -> tuple[int, int, int]:
    """(page, page_size, pages); a page past the end is a 404."""
    size = _int(request, "page_size", default_size, 1, max(PAGE_SIZES))
    pages = max(1, math.ceil(total / size))
    page = _int(request, "page", 1, 1)
    if page > pages:
        raise _bad(f"page {page} does not exist: {total} items make {pages} pages", 404)
    return page, size, pages


def _page_url(request: Request, page: int) -> str:
    """This page's URL with ``page`` replaced (every other parameter kept, repeated ones too)."""
    kept = [(k, v) for k, v in request.query_params.multi_items() if k != "page"]
    return f"{request.url.path}?{urllib.parse.urlencode([*kept, ('page', page)])}"


# --------------------------------------------------------------------------- app


class _Context:
    """What every page of one app needs: templates, the store, its title."""

    def __init__(self, kind: str, title: str) -> None:
        self.kind = kind
        self.title = title
        self.templates = Jinja2Templates(directory=str(_HERE / "templates"))
        self.templates.env.globals["page_url"] = _page_url

    def render(self, request: Request, name: str, code: int = 200, **values: Any) -> Response:
        """Template ``name`` with ``values`` (plus the store's title and kind), status ``code``."""
        values.setdefault("store_title", self.title)
        values.setdefault("kind", self.kind)
        return self.templates.TemplateResponse(request, name, values, status_code=code)


def build_app(
    kind: str,
    target: str | os.PathLike[str],
    *,
    image_root: str | os.PathLike[str] | None = None,
    success_threshold: float = 1.0,
    allowed_hosts: list[str] | None = None,
) -> Starlette:
    """The viewer's ASGI app over one store (opened once, read-only).

    Args:
        kind: one of :data:`KINDS` (what ``target`` is).
        target: the trajectory storage directory, SQLite file, PostgreSQL URL,
            checkpoint ``.metadata`` file or memmap directory.
        image_root: trajectory screenshots are served only from inside this
            directory (default: the storage directory).
        success_threshold: trajectory success is final reward >= this.
        allowed_hosts: the host names (no port; IPv6 in brackets) a request's Host
            header may give; any other gets 400. ``None``: every Host is answered
            (:func:`replaystore.view.allowed_hosts` says what a bind address needs).

    Raises:
        ValueError: an unknown ``kind``.
        ReplayStoreError: the store cannot be opened or read (the message says why).

    Cost: a trajectory storage is indexed here (see :class:`TrajectoryIndex`).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown store kind {kind!r}; kinds: {', '.join(KINDS)}")
    if kind == "trajectory_storage":
        routes, ctx = _trajectory_routes(Path(target), image_root, success_threshold)
    elif kind in ("sqlite_experience_store", "postgres_experience_store"):
        routes, ctx = _experience_routes(kind, str(target))
    else:
        routes, ctx = _transitions_routes(kind, Path(target))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = redact(str(exc.detail))
        return ctx.render(
            request, "error.html", exc.status_code, status=exc.status_code, message=message
        )

    async def server_error(request: Request, exc: Exception) -> Response:
        logger.error("error serving %s", request.url.path, exc_info=exc)
        message = redact(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
        if not isinstance(exc, ReplayStoreError | OSError):
            message = f"unexpected {type(exc).__name__} (details in the server log)"
        return ctx.render(request, "error.html", 500, status=500, message=message)

    routes.append(Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"))
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    if allowed_hosts is not None:
        app.add_middleware(_HostCheck, allowed=allowed_hosts)
    return app


def _host_name(header: str) -> str:
    """The host of a Host header, lower-case, without its port (``[::1]:80`` -> ``[::1]``)."""
    name = header.strip().lower()
    if name.startswith("["):
        return name[: name.find("]") + 1] if "]" in name else name
    return name.rsplit(":", 1)[0] if name.count(":") == 1 else name


class _HostCheck:
    """ASGI middleware: 400, one line of plain text, for a Host outside ``allowed``.

    Runs before routing, so pages, screenshots, static files and 404s are all covered.
    """

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        self.allowed = frozenset(name.lower() for name in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        name = _host_name(header)
        if name in self.allowed:
            await self.app(scope, receive, send)
            return
        shown = name[:80] if name else "(none)"
        message = (
            f"refused: Host {shown!r} is not a name this viewer answers to (a guard against "
            f"DNS rebinding); to reach it by that name, start it with --allow-host {shown}\n"
        )
        await Response(message, status_code=400, media_type="text/plain")(scope, receive, send)


# --------------------------------------------------------------------------- trajectories


def _trajectory_routes(
    root: Path, image_root: str | os.PathLike[str] | None, success_threshold: float
) -> tuple[list[Any], _Context]:
    index = TrajectoryIndex(root, success_threshold=success_threshold)
    allowed = Path(os.path.realpath(image_root if image_root is not None else root))
    ctx = _Context("trajectory_storage", f"trajectories: {root.resolve()}")

    def overview(request: Request) -> Response:
        o = index.overview()
        websites, common = svg.short_labels(
            [display_url(r[0]).split("://", 1)[-1] for r in o["by_website"]]
        )
        by_website = "success rate by website" + (f" ({common}...)" if common else "")
        charts = []
        for key, title, labels in (
            ("by_iteration", "success rate per iteration (what acted)", None),
            ("by_website", by_website, websites),
            ("by_difficulty", "success rate by difficulty", None),
        ):
            rows = o[key]
            charts.append(
                svg.bar_chart(
                    labels or [r[0] for r in rows],
                    [r[1] for r in rows],
                    title,
                    y_max=1.0,
                    notes=[f"{r[2]} of {r[3]}" for r in rows],
                )
            )
        loop, loop_note = _loop_charts(root)
        return ctx.render(
            request,
            "traj_overview.html",
            o=o,
            charts=charts,
            loop=loop,
            loop_note=loop_note,
            root=str(root),
        )

    def listing(request: Request) -> Response:
        f = TrajectoryFilter(
            iteration=_int(request, "iteration", None, 0),
            website=_choice(request, "website", index.websites),
            difficulty=_choice(request, "difficulty", index.difficulties),
            success=_bool(request, "success"),
            blocked=_bool(request, "blocked"),
            min_reward=_float(request, "min_reward"),
            max_reward=_float(request, "max_reward"),
            text=request.query_params.get("q", "").strip() or None,
            acting=_choice(request, "acting", index.actings),
        )
        ids = index.select(f)
        page, size, pages = _paging(request, int(ids.size))
        shown = [index.summary(int(t)) for t in ids[(page - 1) * size : page * size]]
        return ctx.render(
            request,
            "traj_list.html",
            rows=shown,
            total=int(ids.size),
            all_total=index.num_trajectories,
            page=page,
            pages=pages,
            page_size=size,
            page_sizes=PAGE_SIZES,
            index=index,
            q=dict(request.query_params),
        )

    def _tid(request: Request) -> int:
        tid = int(request.path_params["tid"])
        if not 0 <= tid < index.num_trajectories:
            raise _bad(
                f"trajectory {tid} does not exist (this storage holds "
                f"{index.num_trajectories} trajectories: 0..{index.num_trajectories - 1})",
                404,
            )
        return tid

    def trajectory(request: Request) -> Response:
        tid = _tid(request)
        n = int(index.traj_length[tid])
        step = _int(request, "step", 0, 0, n - 1)
        steps = index.read_steps(tid, 0, step + 1)  # the history is needed for the conversation
        current = steps[-1]
        conversation = _conversation(steps)
        image = current["observation"].image_path
        screenshot, refusal = _screenshot_state(Path(str(image)), allowed) if image else ("", "")
        return ctx.render(
            request,
            "traj_step.html",
            t=index.summary(tid),
            step=step,
            n=n,
            s=current,
            action=current["action"].action,
            action_json=json.dumps(current["action"].action, indent=2, default=str),
            evaluation=json.dumps(current["reward"].evaluation, indent=2, default=str),
            page_meta=json.dumps(current["observation"].page_metadata, indent=2, default=str),
            conversation=conversation,
            text_prompt=conversation["record"] is not None and not conversation["record"]["images"],
            screenshot=screenshot or "none",
            refusal=refusal,
            prev_tid=tid - 1 if tid > 0 else None,
            next_tid=tid + 1 if tid + 1 < index.num_trajectories else None,
        )

    def screenshot(request: Request) -> Response:
        tid = _tid(request)
        step = int(request.path_params["step"])
        if not 0 <= step < int(index.traj_length[tid]):
            raise _bad(f"trajectory {tid} has no step {step}", 404)
        image = index.read_steps(tid, step, 1)[0]["observation"].image_path
        if not image:
            raise _bad(f"trajectory {tid} step {step} has no screenshot", 404)
        return _confined_file(Path(str(image)), allowed)

    routes: list[Any] = [
        Route("/", overview),
        Route("/trajectories", listing),
        Route("/trajectory/{tid:int}", trajectory),
        Route("/screenshot/{tid:int}/{step:int}", screenshot),
    ]
    return routes, ctx


def _acting_label(row: dict[str, Any]) -> str:
    """What acted in a loop summary row, as the viewer's other pages say it."""
    if row.get("policy") == "demonstrations":
        return "demonstrations"
    return " ".join(str(p) for p in (row.get("policy"), row.get("checkpoint")) if p)


def _loop_charts(storage: Path) -> tuple[list[str], str]:
    """The charts of the loop run ``storage`` belongs to, and a note; ``([], "")`` when it
    is not a loop run's storage.

    A loop run keeps its storage in ``OUT/storage`` beside ``OUT/summary.json`` and
    ``OUT/journal.json``. The summary is read on every request, so a page reloaded during
    a run shows the iterations finished so far. Its charts: the held-out success per
    iteration (seeds never trained on; the mean and each task, the untrained model as a
    dashed line), and the success on each iteration's training tasks; both name what
    acted (the demonstrations, or the checkpoint served) and number iterations as the
    loop does (0 is the demonstrations).
    """
    run = storage.parent
    path = run / "summary.json"
    if storage.name != "storage" or not (run / "journal.json").is_file() or not path.is_file():
        return [], ""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        charts = _loop_figures(summary)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        return [], f"the loop's summary {path} cannot be read ({why}); its charts are left out"
    return charts, f"loop run {run}: iterations as the loop numbers them (0 is the demonstrations)"


def _loop_figures(summary: dict[str, Any]) -> list[str]:
    """The charts of a loop's ``summary.json`` (see :func:`_loop_charts`).

    Raises:
        KeyError, TypeError, AttributeError, ValueError: the summary is not the loop's shape.
    """
    rows = list(summary["iterations"])
    labels = [f"{r['iteration']}: {_acting_label(r)}" for r in rows]
    charts = []
    untrained = summary.get("untrained") or {}
    held = [r.get("eval") for r in rows]
    if any(held):
        tasks = sorted({name for h in held if h for name in h["tasks"]})
        nan = float("nan")
        series = [("mean over tasks", [h["mean"] if h else nan for h in held])]
        series += [(t, [h["tasks"].get(t, nan) if h else nan for h in held]) for t in tasks]
        base = (untrained.get("eval") or {}).get("mean")
        evaluation = summary.get("evaluation") or {}
        charts.append(
            svg.line_chart(
                labels,
                series,
                f"held-out success per iteration (seeds {evaluation.get('seeds', '?')})",
                reference=("untrained model", float(base)) if base is not None else None,
            )
        )
    train_labels, train_values, notes = list(labels), [], []
    for r in rows:
        rate = r.get("success_rate")
        train_values.append(float(rate) if rate is not None else float("nan"))
        notes.append(f"{r.get('successful')} of {r.get('num_tasks')}")
    if untrained.get("success_rate") is not None and not any(held):
        train_labels.insert(0, "untrained")  # measured on the training tasks
        train_values.insert(0, float(untrained["success_rate"]))
        notes.insert(0, f"{untrained.get('successful')} of {untrained.get('num_tasks')}")
    charts.append(
        svg.bar_chart(
            train_labels,
            train_values,
            "success on each iteration's training tasks",
            y_max=1.0,
            notes=notes,
        )
    )
    return charts


def _refusal(path: Path, root: Path) -> str | None:
    """Why the screenshot route refuses ``path`` (403), or None when it may serve it.

    Outside the image root, the message names the exact ``--image-root`` that would
    allow it: the deepest directory holding both the root and the file (the file's own
    directory when that would be the filesystem root).
    """
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(root):
        wider = Path(os.path.commonpath([root, real.parent]))
        if wider == Path(wider.anchor):
            wider = real.parent
        return (
            f"refused: the screenshot {path} is outside the image root {root}; to show it, "
            f"start the viewer with --image-root {shlex.quote(str(wider))}"
        )
    if real.suffix.lower() not in _IMAGE_TYPES:
        return f"refused: {path} is not an image file (png, jpeg, webp, gif)"
    return None


def _confined_file(path: Path, root: Path) -> Response:
    """A file response for ``path`` if its real path lies inside ``root``; else 403/404."""
    refusal = _refusal(path, root)
    if refusal is not None:
        raise _bad(refusal, 403)
    real = Path(os.path.realpath(path))
    if not real.is_file():
        raise _bad(f"screenshot file {path} not found", 404)
    return FileResponse(real, media_type=_IMAGE_TYPES[real.suffix.lower()])


def _screenshot_state(path: Path, root: Path) -> tuple[str, str]:
    """``("ok", "")`` when the screenshot route would serve ``path``, else why not
    (``"refused"`` with the route's message, ``"missing"``): the page shows a note
    instead of a broken image."""
    refusal = _refusal(path, root)
    if refusal is not None:
        return "refused", refusal
    return ("ok", "") if Path(os.path.realpath(path)).is_file() else ("missing", "")


def _conversation(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The ShareGPT record ``replaystore export`` would write for the last of ``steps``.

    The prompt is the stored ``raw_prompt``; a step without one gets the default
    :class:`~replaystore.trajectories.context.ConversationBuilder`'s, as the export
    command builds it. The record itself comes from the exporter's
    :func:`~replaystore.trajectories.export.sample_to_record` (images by path;
    embedded data-URL images are decoded into a temporary directory that is removed).
    """
    from replaystore.trajectories.buffer import parse_prompt
    from replaystore.trajectories.context import ConversationBuilder
    from replaystore.trajectories.export import sample_to_record

    current = steps[-1]
    response = current["response"]
    try:
        if response.raw_prompt:
            messages = parse_prompt(response.raw_prompt, f"step {len(steps) - 1}")
            source = "the stored prompt (response.raw_prompt)"
        else:
            messages = ConversationBuilder().build(
                current["observation"].task, steps[:-1], current["observation"]
            )
            source = "no stored prompt: rebuilt with the default ConversationBuilder, as "
            source += "`replaystore export` does"
        with tempfile.TemporaryDirectory() as tmp:
            record = sample_to_record(
                {"message": messages, "action": str(response.raw_response or "")}, out_dir=tmp
            )
            if any(str(i).startswith(tmp) for i in record.get("images", [])):
                record["images"] = [
                    "(embedded image)" if str(i).startswith(tmp) else i for i in record["images"]
                ]
    except ReplayStoreError as exc:
        return {"error": str(exc), "source": "", "record": None}
    return {"error": None, "source": source, "record": record}


# --------------------------------------------------------------------------- experience


def _experience_routes(kind: str, target: str) -> tuple[list[Any], _Context]:
    reader: ExperienceReader
    if kind == "sqlite_experience_store":
        from replaystore.view.experience import SqliteReader

        reader = SqliteReader(target)
    else:
        from replaystore.experience.storage.urls import open_storage
        from replaystore.formats.postgres_experience import read_summary
        from replaystore.view.experience import StorageReader

        # Opening a PostgresStorage creates its tables when the schema has none; check
        # first, read-only, that the store exists, so the viewer never creates one.
        summary = read_summary(target)
        reader = StorageReader(
            open_storage(target),
            f"PostgreSQL experience store {summary['url']} schema {summary['schema']}",
        )
    ctx = _Context(kind, reader.description)

    def tasks(request: Request) -> Response:
        total, _ = reader.tasks(1, 1)
        page, size, pages = _paging(request, total, 50)
        _, shown = reader.tasks(page, size)
        return ctx.render(
            request,
            "exp_tasks.html",
            tasks=shown,
            total=total,
            rows_total=reader.size(),
            page=page,
            pages=pages,
            page_size=size,
            page_sizes=PAGE_SIZES,
            q=dict(request.query_params),
        )

    def rows(request: Request) -> Response:
        fields = request.query_params.getlist("field")
        ops = request.query_params.getlist("op")
        values = request.query_params.getlist("value")
        if not (len(fields) == len(ops) == len(values)):
            raise _bad("each filter row needs a field, an op and a value (the value may be empty)")
        filters = list(zip(fields, ops, values, strict=True))
        try:
            cond = condition_from_form(filters)
            total = reader.size(cond)
        except QueryError as exc:
            raise _bad(f"bad filter: {exc}") from None
        page, size, pages = _paging(request, total, 50)
        shown = reader.rows(page, size, cond)
        while len(filters) < 3:
            filters.append(("", "eq", ""))
        return ctx.render(
            request,
            "exp_rows.html",
            rows=shown,
            total=total,
            page=page,
            pages=pages,
            page_size=size,
            page_sizes=PAGE_SIZES,
            filters=filters,
            ops=FILTER_OPS,
            condition=json.dumps(cond) if cond else "",
            q=dict(request.query_params),
        )

    def row(request: Request) -> Response:
        row_id = request.path_params["row_id"]
        found = reader.row(row_id)
        if found is None:
            raise _bad(f"no row with id {row_id[:80]!r}", 404)
        return ctx.render(request, "exp_row.html", row=found, text=row_json(found))

    return [Route("/", tasks), Route("/rows", rows), Route("/row/{row_id}", row)], ctx


# --------------------------------------------------------------------------- transitions


def _transitions_routes(kind: str, target: Path) -> tuple[list[Any], _Context]:
    summary = read_transitions(kind, target)
    what = "checkpoint" if kind == "transitions_checkpoint" else "memory-mapped buffer"
    ctx = _Context(kind, f"transitions {what}: {target.resolve()}")
    charts: list[str] = []
    for values, title in (
        (summary.rewards, f"rewards ({summary.reward_key})"),
        (summary.priorities, "priorities"),
        (summary.episode_returns, "episode returns"),
    ):
        if values is not None:
            charts.append(svg.histogram(values, title))

    def page(request: Request) -> Response:
        return ctx.render(request, "transitions.html", s=summary, charts=charts)

    return [Route("/", page)], ctx
