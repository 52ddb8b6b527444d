"""The text a text-mode model reads (``page_text``) and the element actions that name its
ids, on a real Chromium."""

from __future__ import annotations

from typing import Any

import pytest

from replaystore.rollouts.actions import execute_action, format_action, parse_action
from replaystore.rollouts.page_text import page_text, parse_page_text

from .conftest import pool, run

PAGE = """<!doctype html><html><head><title>t</title></head><body>
<div id="goal">Do not show me</div>
<p>Total: <b>$39.99</b></p>
<label for="name">Name</label><input id="name" type="text">
<input id="secret" type="password" value="hunter2" aria-label="Password">
<label><input type="checkbox" id="box"> Agree</label>
<select id="colour"><option>Red</option><option>Blue</option></select>
<span style="cursor:pointer">nam</span>
<button onclick="document.title='clicked ' + document.getElementById('name').value">Submit</button>
<div style="display:none"><button>Hidden</button></div>
<div id="after"></div>
</body></html>"""


def _with_page(browser: Any, body: Any) -> Any:
    async def go() -> Any:
        async with pool(browser, 1) as p, p.context() as context:
            page = await context.new_page()
            await page.set_content(PAGE)
            return await body(page)

    return run(go())


def _line(text: str, role: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"{role} '{name}'"))


def test_static_text_and_elements_with_name_before_id(browser: Any) -> None:
    async def body(page: Any) -> str:
        return await page_text(page, skip="#goal")

    text = _with_page(browser, body)
    lines = text.splitlines()
    assert "StaticText 'Total:' id=" in text and "StaticText '$39.99' id=" in text
    assert _line(text, "textbox", "Name").startswith("textbox 'Name' id=")
    # A password's value is never shown, only its length.
    assert _line(text, "textbox", "Password").endswith("value='*******'")
    assert "hunter2" not in text
    assert _line(text, "checkbox", "Agree")
    assert not any(line.startswith("StaticText 'Agree'") for line in lines)  # its label
    assert _line(text, "combobox", "").endswith("value='Red'")
    assert _line(text, "option", "Red").endswith("selected")
    assert _line(text, "StaticText", "nam").endswith("clickable")
    assert "Hidden" not in text and "Do not show me" not in text
    assert all(" id=" in line for line in lines)
    assert "@(" not in text and "http" not in text  # no coordinates, no URL, no port
    parsed = parse_page_text(text)
    assert len(parsed) == len(lines)
    box = next(e for e in parsed if e.role == "combobox")
    assert box.value == "Red" and box.element_id.isdigit()


def test_ids_are_stable_across_observations_and_new_elements_get_new_ones(browser: Any) -> None:
    async def body(page: Any) -> tuple[str, str]:
        first = await page_text(page)
        await page.evaluate(
            "() => { const b = document.createElement('button'); b.textContent = 'New';"
            " document.getElementById('after').appendChild(b); }"
        )
        return first, await page_text(page)

    first, second = _with_page(browser, body)
    before = {(e.role, e.name): e.element_id for e in parse_page_text(first)}
    after = {(e.role, e.name): e.element_id for e in parse_page_text(second)}
    assert all(after[key] == value for key, value in before.items())
    assert after[("button", "New")] not in before.values()


def test_the_text_is_bounded(browser: Any) -> None:
    async def body(page: Any) -> str:
        await page.evaluate(
            "() => { for (let i = 0; i < 300; i++) { const p = document.createElement('p');"
            " p.textContent = 'line ' + i; document.body.appendChild(p); } }"
        )
        return await page_text(page, max_lines=50)

    text = _with_page(browser, body)
    lines = text.splitlines()
    assert len(lines) == 51 and lines[-1].startswith("... (") and lines[-1].endswith("more lines)")
    with pytest.raises(ValueError, match="max_lines"):
        _with_page(browser, lambda page: page_text(page, max_lines=0))


def test_element_actions_fill_select_click_and_press_by_id(browser: Any) -> None:
    async def body(page: Any) -> dict[str, Any]:
        elements = {(e.role, e.name): e.element_id for e in parse_page_text(await page_text(page))}
        name, colour = elements[("textbox", "Name")], elements[("combobox", "")]
        button, box = elements[("button", "Submit")], elements[("checkbox", "Agree")]
        outcomes = {}
        for text in (
            f'fill("{name}", "Jerald")',
            f'select_option("{colour}", "Blue")',
            f'click("{box}")',
            f'press("{name}", "End")',
            f'click("{button}")',
        ):
            outcome = await execute_action(page, parse_action(text), settle_s=0.05)
            outcomes[text] = outcome.error
        missing = await execute_action(page, parse_action('click("999")'), settle_s=0.05)
        return {
            "errors": outcomes,
            "missing": missing.error,
            "title": await page.title(),
            "colour": await page.eval_on_selector("#colour", "e => e.value"),
            "box": await page.eval_on_selector("#box", "e => e.checked"),
            "text": await page_text(page),
        }

    got = _with_page(browser, body)
    assert all(error is None for error in got["errors"].values()), got["errors"]
    assert got["title"] == "clicked Jerald"
    assert got["colour"] == "Blue" and got["box"] is True
    assert got["missing"] == "click: no element with id 999 on the page"
    assert "value='Jerald'" in _line(got["text"], "textbox", "Name")
    assert _line(got["text"], "checkbox", "Agree").endswith("checked")


def test_a_click_on_a_button_half_covered_lands_on_the_part_that_shows(browser: Any) -> None:
    """Playwright clicks the centre and waits while another element covers it; the click
    action clicks a visible part of the element instead, at once (the cover is not hit)."""

    async def body(page: Any) -> dict[str, Any]:
        await page.set_content(
            "<button id=b style='position:absolute;left:10px;top:10px;width:80px;height:30px'"
            " onclick='hits.push(\"button\")'>ONE</button>"
            "<div style='position:absolute;left:40px;top:0;width:100px;height:60px'"
            " onclick='hits.push(\"cover\")'>cover</div><script>var hits = [];</script>"
        )
        element = next(e for e in parse_page_text(await page_text(page)) if e.name == "ONE")
        outcome = await execute_action(
            page, parse_action(f'click("{element.element_id}")'), settle_s=0.0
        )
        return {"error": outcome.error, "hits": await page.evaluate("hits")}

    got = _with_page(browser, body)
    assert got == {"error": None, "hits": ["button"]}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('click("12")', {"key": "click", "element": "12"}),
        ("click('7')", {"key": "click", "element": "7"}),
        ('fill("3", "Jerald")', {"key": "fill", "element": "3", "text": "Jerald"}),
        (
            'select_option("1", "Sudan")',
            {"key": "select_option", "element": "1", "option": "Sudan"},
        ),
        ('press("2", "Enter")', {"key": "press", "element": "2", "name": "Enter"}),
        ('focus("4")', {"key": "focus", "element": "4"}),
        ('clear("4")', {"key": "clear", "element": "4"}),
        ('hover("4")', {"key": "hover", "element": "4"}),
        ('dblclick("4")', {"key": "dblclick", "element": "4"}),
        ("scroll(0, 200)", {"key": "scroll", "dx": 0.0, "dy": 200.0}),
        ("noop()", {"key": "noop"}),
        ('send_msg_to_user("done")', {"key": "answer", "text": "done"}),
    ],
)
def test_browsergym_actions_parse_and_format_back(text: str, expected: dict) -> None:
    action = parse_action(text)
    assert action.action == expected
    assert parse_action(format_action(expected)).action == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('click("a")', "a number like"),
        ('fill("3")', "takes 2 arguments"),
        ('fill(3, "x")', "quoted number"),
        ("press(\"3\", '')", "key name is empty"),
        ("scroll(0, 1e9)", "within 100000"),
        ('focus("1", "2")', "takes 1 argument"),
    ],
)
def test_bad_element_actions_are_invalid_with_the_reason(text: str, reason: str) -> None:
    action = parse_action(text)
    assert action.action["key"] == "invalid"
    assert reason in action.action["reason"]


def test_textareas_and_tree_nodes_say_what_they_are(browser: Any) -> None:
    async def body(page: Any) -> str:
        await page.set_content(
            "<textarea>hi</textarea><input type=text value=hi>"
            "<ul><li><span style='cursor:pointer'>Open</span><ul><li>Leaf</li></ul></li>"
            "<li><span style='cursor:pointer'>Shut</span><ul style='display:none'>"
            "<li>Hidden</li></ul></li></ul>"
        )
        return await page_text(page)

    text = _with_page(browser, body)
    boxes = [line for line in text.splitlines() if line.startswith("textbox")]
    assert boxes[0].endswith("value='hi' multiline") and "multiline" not in boxes[1]
    assert _line(text, "StaticText", "Open").endswith("clickable expanded")
    assert _line(text, "StaticText", "Shut").endswith("clickable collapsed")
    assert "Hidden" not in text and "StaticText 'Leaf'" in text
    parsed = parse_page_text(text)
    assert "collapsed" in next(e.states for e in parsed if e.name == "Shut")
    area = next(e for e in parsed if e.role == "textbox")
    assert area.value == "hi" and "multiline" in area.states
