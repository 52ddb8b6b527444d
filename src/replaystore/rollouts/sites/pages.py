"""The local website suite's content and page renderers (plain HTML, no scripts needed).

Six sites, each a host under ``.localhost`` (browsers resolve ``*.localhost`` to
the loopback address, so every site is its own domain for the blocklist):

=========  ==============================================================
host       pages
=========  ==============================================================
shop       home (search box, categories), search results with category and
           price filters, product pages (price, stock)
travel     booking form (destination, passenger name), results, booking
           confirmation with a code
recipes    categories, recipe lists, recipe pages (time, servings)
library    catalogue search, book records, availability by branch
news       front page (with a Subscribe button that does nothing), sections,
           articles
botwall    an anti-bot wall: every page answers HTTP 403 with a CAPTCHA
=========  ==============================================================

:func:`render` maps (host, path, query) to (status, title, body HTML).
"""

from __future__ import annotations

import contextlib
import html
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SITES", "render"]

#: Site name (host label) -> (display name, header colour).
SITES: dict[str, tuple[str, str]] = {
    "shop": ("Acme Shop", "#225ea8"),
    "travel": ("Skyway Travel", "#148c78"),
    "recipes": ("Greenfork Recipes", "#5a8c28"),
    "library": ("City Library", "#6e4696"),
    "news": ("Metro News", "#3c3c3c"),
    "botwall": ("Botwall Market", "#a03c28"),
}


@dataclass(frozen=True, slots=True)
class Product:
    pid: str
    name: str
    category: str
    price: float
    stock: int


PRODUCTS = (
    Product("p1", "Red Kettle", "Kitchen", 39.99, 12),
    Product("p2", "Steel Kettle", "Kitchen", 54.50, 3),
    Product("p3", "Desk Lamp", "Home", 24.00, 0),
    Product("p4", "Floor Lamp", "Home", 89.00, 7),
    Product("p5", "USB-C Cable", "Electronics", 9.99, 140),
    Product("p6", "Wireless Headphones", "Electronics", 129.00, 5),
    Product("p7", "Travel Mug", "Kitchen", 15.25, 30),
    Product("p8", "Reading Lamp", "Home", 32.75, 9),
)

FLIGHTS = {
    "lisbon": [("SW101", "07:10", 189), ("SW117", "12:40", 129), ("SW133", "19:05", 154)],
    "oslo": [("SW202", "06:30", 210), ("SW214", "15:20", 242)],
    "rome": [("SW305", "09:15", 99), ("SW321", "17:45", 119), ("SW339", "21:30", 87)],
}

RECIPES = {
    "soups": [("r1", "Lentil Soup", 45, 4), ("r2", "Tomato Soup", 30, 2)],
    "baking": [("r3", "Oat Cookies", 25, 24), ("r4", "Banana Bread", 70, 8)],
    "salads": [("r5", "Greek Salad", 15, 2), ("r6", "Quinoa Salad", 20, 3)],
}

BOOKS = (
    ("b1", "Middlemarch", "George Eliot", {"Riverside": 2, "Old Town": 0, "Harbour": 1}),
    ("b2", "Dune", "Frank Herbert", {"Riverside": 0, "Old Town": 3, "Harbour": 0}),
    ("b3", "Persuasion", "Jane Austen", {"Riverside": 0, "Old Town": 0, "Harbour": 2}),
    ("b4", "Dune Messiah", "Frank Herbert", {"Riverside": 1, "Old Town": 0, "Harbour": 0}),
)

ARTICLES = {
    "transport": [
        ("a1", "Night trams return to the harbour line", "2026-03-02"),
        ("a2", "Bike lanes extended along the river", "2026-02-20"),
    ],
    "weather": [
        ("a3", "Storm warning lifted for the coast", "2026-03-01"),
        ("a4", "Driest February in forty years", "2026-02-28"),
    ],
    "culture": [("a5", "City museum opens a new wing", "2026-02-25")],
}

_STYLE = (
    "body{margin:0;font:18px/1.5 sans-serif;background:#f6f6f6;color:#141414}"
    "header{padding:10px 16px;color:#fff;font-size:22px}"
    "main{padding:12px 16px}a{color:#1a4fa0;text-decoration:underline}"
    "input{font:18px sans-serif;padding:4px;width:260px}"
    "button{font:18px sans-serif;padding:6px 14px;margin:4px}"
    "li{margin:6px 0}td,th{padding:4px 10px;text-align:left}"
    # No animations, caret or focus ring: a click that changes nothing leaves the same pixels.
    "*{transition:none!important;animation:none!important;caret-color:transparent}"
    "*:focus{outline:none!important}"
    # Fixed colours: the browser's own hover/focus styles would repaint a dead button.
    "input,button{border:1px solid #777!important;border-radius:2px;background:#fff!important;"
    "color:#141414!important;box-shadow:none!important}button{background:#e6e6e6!important}"
)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _page(site: str, title: str, body: str) -> str:
    name, colour = SITES[site]
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
        f"<style>{_STYLE}</style></head><body><header style='background:{colour}'>"
        f"<a href='/' style='color:#fff'>{_e(name)}</a></header><main>{body}</main></body></html>"
    )


Rendered = tuple[int, str, str]  # (HTTP status, title, full HTML)


def _not_found(site: str, path: str) -> Rendered:
    return 404, "Not found", _page(site, "Not found", f"<h1>Not found</h1><p>{_e(path)}</p>")


def _one(query: Mapping[str, list[str]], key: str) -> str:
    return (query.get(key) or [""])[0].strip()


def _shop(path: str, query: Mapping[str, list[str]]) -> Rendered:
    if path == "/":
        cats = sorted({p.category for p in PRODUCTS})
        links = "".join(f"<li><a href='/search?category={_e(c)}'>{_e(c)}</a></li>" for c in cats)
        body = (
            "<h1>Welcome to Acme Shop</h1><form action='/search' method='get'>"
            "<input name='q' aria-label='Search products' placeholder='Search products'> "
            "<button type='submit'>Search</button></form>"
            f"<h2>Categories</h2><ul>{links}</ul>"
        )
        return 200, "Acme Shop", _page("shop", "Acme Shop", body)
    if path == "/search":
        q, cat, cap = _one(query, "q").lower(), _one(query, "category"), _one(query, "max_price")
        hits = [p for p in PRODUCTS if q in p.name.lower() and (not cat or p.category == cat)]
        with contextlib.suppress(ValueError):
            hits = [p for p in hits if p.price <= float(cap or "inf")]
        base = f"/search?q={_e(q)}&category={_e(cat)}"
        filters = (
            f"<p>Filter: <a href='{base}&max_price=30'>Under $30</a> | "
            f"<a href='{base}&max_price=60'>Under $60</a> | <a href='/search?q={_e(q)}'>"
            "All categories</a></p>"
        )
        rows = "".join(
            f"<li><a href='/product/{p.pid}'>{_e(p.name)}</a> ${p.price:.2f}</li>" for p in hits
        )
        title = f"Results for {q or cat or 'all'}"
        body = f"<h1>{_e(title)}</h1>{filters}<ul>{rows or '<li>No products found</li>'}</ul>"
        return 200, f"{title} - Acme Shop", _page("shop", title, body)
    if path.startswith("/product/"):
        product = next((p for p in PRODUCTS if p.pid == path.rsplit("/", 1)[1]), None)
        if product is None:
            return _not_found("shop", path)
        stock = f"{product.stock} in stock" if product.stock else "Out of stock"
        body = (
            f"<h1>{_e(product.name)}</h1><p>Category: {_e(product.category)}</p>"
            f"<p>Price: ${product.price:.2f}</p><p>{stock}</p>"
            "<button type='button' onclick=\"this.textContent='Added to cart'\">"
            "Add to cart</button>"
        )
        return 200, f"{product.name} - Acme Shop", _page("shop", product.name, body)
    return _not_found("shop", path)


def _travel(path: str, query: Mapping[str, list[str]]) -> Rendered:
    if path == "/":
        body = (
            "<h1>Book a flight</h1><form action='/flights' method='get'>"
            "<p>From: Berlin</p><p><input name='to' aria-label='Destination' "
            "placeholder='Destination'></p><button type='submit'>Search flights</button></form>"
        )
        return 200, "Skyway Travel", _page("travel", "Skyway Travel", body)
    if path == "/flights":
        to = _one(query, "to")
        flights = FLIGHTS.get(to.lower(), [])
        rows = "".join(
            f"<tr><td><a href='/book?flight={code}'>{code}</a></td><td>{dep}</td>"
            f"<td>${price}</td></tr>"
            for code, dep, price in sorted(flights, key=lambda f: f[1])
        )
        table = (
            f"<table><tr><th>Flight</th><th>Departs</th><th>Fare</th></tr>{rows}</table>"
            if rows
            else "<p>No flights found</p>"
        )
        title = f"Flights to {to.title() or 'nowhere'}"
        return 200, f"{title} - Skyway", _page("travel", title, f"<h1>{_e(title)}</h1>{table}")
    if path == "/book":
        code = _one(query, "flight")
        name = _one(query, "name")
        if not any(code == f[0] for fs in FLIGHTS.values() for f in fs):
            return _not_found("travel", path)
        if name:
            confirmation = f"SK-{code[2:]}-{sum(map(ord, name.lower())) % 1000:03d}"
            body = (
                f"<h1>Booking confirmed</h1><p>Passenger: {_e(name)}</p>"
                f"<p>Flight {code}</p><p>Confirmation code: {confirmation}</p>"
            )
            return 200, "Booking confirmed - Skyway", _page("travel", "Booking confirmed", body)
        body = (
            f"<h1>Book flight {code}</h1><form action='/book' method='get'>"
            f"<input type='hidden' name='flight' value='{code}'><p><input name='name' "
            "aria-label='Passenger name' placeholder='Passenger name'></p>"
            "<button type='submit'>Confirm booking</button></form>"
        )
        return 200, f"Book {code} - Skyway", _page("travel", f"Book {code}", body)
    return _not_found("travel", path)


def _recipes(path: str, query: Mapping[str, list[str]]) -> Rendered:
    if path == "/":
        links = "".join(f"<li><a href='/c/{c}'>{c.title()}</a></li>" for c in RECIPES)
        body = f"<h1>Recipe categories</h1><ul>{links}</ul>"
        return 200, "Greenfork Recipes", _page("recipes", "Greenfork Recipes", body)
    if path.startswith("/c/"):
        items = RECIPES.get(path[3:])
        if items is None:
            return _not_found("recipes", path)
        links = "".join(f"<li><a href='/r/{rid}'>{_e(name)}</a></li>" for rid, name, *_ in items)
        title = path[3:].title()
        return (
            200,
            f"{title} - Greenfork",
            _page("recipes", title, f"<h1>{title}</h1><ul>{links}</ul>"),
        )
    if path.startswith("/r/"):
        for items in RECIPES.values():
            for rid, name, minutes, serves in items:
                if rid == path[3:]:
                    body = (
                        f"<h1>{_e(name)}</h1><p>Total time: {minutes} minutes</p>"
                        f"<p>Serves {serves}</p>"
                    )
                    return 200, f"{name} - Greenfork", _page("recipes", name, body)
    return _not_found("recipes", path)


def _library(path: str, query: Mapping[str, list[str]]) -> Rendered:
    if path == "/":
        body = (
            "<h1>Catalogue search</h1><form action='/search' method='get'>"
            "<input name='q' aria-label='Search the catalogue' placeholder='Title or author'> "
            "<button type='submit'>Search</button></form>"
        )
        return 200, "City Library", _page("library", "City Library", body)
    if path == "/search":
        q = _one(query, "q").lower()
        hits = [b for b in BOOKS if q and (q in b[1].lower() or q in b[2].lower())]
        rows = "".join(
            f"<li><a href='/book/{bid}'>{_e(title)}</a> by {_e(author)}</li>"
            for bid, title, author, _ in hits
        )
        title = f"Catalogue: {q}"
        body = f"<h1>{_e(title)}</h1><ul>{rows or '<li>No records</li>'}</ul>"
        return 200, f"{title} - City Library", _page("library", title, body)
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] == "book":
        book = next((b for b in BOOKS if b[0] == parts[1]), None)
        if book is None:
            return _not_found("library", path)
        bid, title, author, copies = book
        if len(parts) == 3 and parts[2] == "availability":
            rows = "".join(f"<tr><td>{b}</td><td>{n}</td></tr>" for b, n in copies.items())
            body = (
                f"<h1>Availability: {_e(title)}</h1><table><tr><th>Branch</th>"
                f"<th>Copies</th></tr>{rows}</table>"
            )
            return 200, f"Availability {title}", _page("library", title, body)
        body = (
            f"<h1>{_e(title)}</h1><p>Author: {_e(author)}</p>"
            f"<p><a href='/book/{bid}/availability'>Check availability</a></p>"
        )
        return 200, f"{title} - City Library", _page("library", title, body)
    return _not_found("library", path)


def _news(path: str, query: Mapping[str, list[str]]) -> Rendered:
    if path == "/":
        links = "".join(f"<li><a href='/s/{s}'>{s.title()}</a></li>" for s in ARTICLES)
        body = (
            "<h1>Front page</h1>"
            # The Subscribe button has no handler: clicking it changes nothing.
            "<button type='button'>Subscribe</button>"
            f"<h2>Sections</h2><ul>{links}</ul>"
        )
        return 200, "Metro News", _page("news", "Metro News", body)
    if path.startswith("/s/"):
        items = ARTICLES.get(path[3:])
        if items is None:
            return _not_found("news", path)
        latest_first = sorted(items, key=lambda a: a[2], reverse=True)
        links = "".join(
            f"<li><a href='/a/{aid}'>{_e(head)}</a> ({day})</li>" for aid, head, day in latest_first
        )
        title = path[3:].title()
        return (
            200,
            f"{title} - Metro News",
            _page("news", title, f"<h1>{title}</h1><ul>{links}</ul>"),
        )
    if path.startswith("/a/"):
        for items in ARTICLES.values():
            for aid, head, day in items:
                if aid == path[3:]:
                    body = f"<h1>{_e(head)}</h1><p>Published {day}</p><p>Story text.</p>"
                    return 200, f"{head} - Metro News", _page("news", head, body)
    return _not_found("news", path)


def _botwall(path: str, query: Mapping[str, list[str]]) -> Rendered:
    body = (
        "<h1>Are you a robot?</h1><p>Complete the CAPTCHA to continue.</p>"
        "<p><label><input type='checkbox'> I am not a robot</label></p>"
    )
    return 403, "Access denied", _page("botwall", "Access denied", body)


_RENDERERS = {
    "shop": _shop,
    "travel": _travel,
    "recipes": _recipes,
    "library": _library,
    "news": _news,
    "botwall": _botwall,
}


def render(site: str, path: str, query: Mapping[str, list[str]]) -> Rendered:
    """``(status, title, html)`` of ``path`` on ``site`` (404 page for unknown paths or sites)."""
    renderer = _RENDERERS.get(site)
    if renderer is None:
        return 404, "Unknown site", f"<!doctype html><title>Unknown site</title><h1>{_e(site)}</h1>"
    return renderer(path, query)
