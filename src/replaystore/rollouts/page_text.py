"""The page as text for a model that reads no screenshot: elements and static text, each
with a stable id that text-mode actions name.

One line per node, in document order, in the shape BrowserGym's AXTree text has (role,
accessible name, element id), with the name before the id::

    StaticText 'Enter the password' id=4
    textbox 'Password' id=5 focused
    checkbox 'Lorem' id=7 checked
    combobox 'Colour' id=9 value='Red'
    option 'Red' id=10 selected
    button 'Submit' id=12

Why the name comes first: a model finds the name the goal mentions and copies what
follows it. Measured on a 4-layer tiny Qwen2 trained from scratch on synthetic
click-the-named-element prompts (issue 37): ``[34] button 'Lorem'`` reached 2% on new
instances, ``button 'Lorem' id=34`` 48%.

* **Ids are stable**: an element keeps its id (``data-rsid`` attribute, given on first
  sight, counting from 1 per page) for as long as it lives, so an id read at one step
  names the same element at the next. ``click("12")`` and friends
  (:mod:`replaystore.rollouts.actions`) find it by that attribute.
* **Static text** is shown, not only interactive elements: an answer on the page can be
  read, and a text the page listens to (a tree node, a tab, a span with a click
  handler) can be clicked by its id, which is its element's.
* **State**: ``value='...'`` of a filled textbox or a select (a password's as
  ``*``), ``multiline`` (a textarea), ``checked``, ``selected``, ``focused``,
  ``disabled``; ``clickable`` on static text whose element shows the pointer cursor (a
  link drawn as a span), ``collapsed``/``expanded`` on a tree node (its
  ``aria-expanded``, else whether the list right after it is shown).
* **Bounded**: at most ``max_lines`` lines of at most 80-character names; a cut tree
  ends with ``... (N more lines)``.
* **No coordinates, no URL, no port**: the text depends on the page's content only.

Hidden elements (``display: none``, ``visibility: hidden``, zero size, or under an
element matched by ``skip``) are left out. Cost: one script evaluation in the page.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ID_ATTRIBUTE",
    "PageElement",
    "element_selector",
    "page_text",
    "parse_page_text",
]

#: The attribute that holds an element's id (``click("12")`` finds ``[data-rsid="12"]``).
ID_ATTRIBUTE = "data-rsid"
_MAX_LINES = 120
_MAX_NAME = 80

_PAGE_TEXT_JS = r"""
([skip, maxLines, maxName]) => {
  const ATTR = 'data-rsid';
  const interactive = 'a[href],button,input:not([type=hidden]),select,textarea,summary,' +
    '[role=button],[role=link],[role=checkbox],[role=radio],[role=tab],[role=menuitem],' +
    '[role=option],[role=treeitem],[role=textbox],[onclick],[contenteditable=true]';
  const skipped = skip ? Array.from(document.querySelectorAll(skip)) : [];
  const idOf = (el) => {
    let id = el.getAttribute(ATTR);
    if (!id) {
      window.__rsidNext = (window.__rsidNext || 0) + 1;
      id = String(window.__rsidNext);
      el.setAttribute(ATTR, id);
    }
    return id;
  };
  const clean = (s) => String(s || '').replace(/\s+/g, ' ').trim().slice(0, maxName)
    .replace(/'/g, '\u2019');
  const role = (el) => {
    const explicit = el.getAttribute('role');
    if (explicit) return explicit;
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
      if (t === 'range') return 'slider';
      if (t === 'number') return 'spinbutton';
      return 'textbox';
    }
    if (el.isContentEditable) return 'textbox';
    return 'generic';
  };
  const name = (el) => {
    const aria = el.getAttribute('aria-label');
    if (aria) return aria;
    const tag = el.tagName.toLowerCase();
    if (el.labels && el.labels.length) return el.labels[0].innerText;
    if (tag === 'input' || tag === 'textarea' || tag === 'select') {
      return el.getAttribute('placeholder') || el.getAttribute('title') ||
             (tag === 'input' && ['submit', 'button', 'reset'].includes(el.type) ? el.value : '');
    }
    return (el.innerText || el.textContent || '').trim() || el.getAttribute('title') ||
           el.getAttribute('alt') || '';
  };
  const pruned = (el) => skipped.some((s) => s.contains(el)) ||
    getComputedStyle(el).display === 'none';
  const shown = (el) => {  // the element itself is seen (its children may be, regardless)
    if (getComputedStyle(el).visibility === 'hidden') return false;
    const r = el.getBoundingClientRect();
    return r.width >= 1 && r.height >= 1;
  };
  const range = document.createRange();
  const textShown = (node) => {
    if (getComputedStyle(node.parentElement).visibility === 'hidden') return false;
    range.selectNodeContents(node);
    const r = range.getBoundingClientRect();
    return r.width >= 1 && r.height >= 1;
  };
  // A tree node: its aria-expanded, else whether the list right after it is shown.
  const openness = (el) => {
    const aria = el.getAttribute('aria-expanded');
    if (aria === 'true') return ' expanded';
    if (aria === 'false') return ' collapsed';
    const list = el.nextElementSibling;
    if (!list || !['UL', 'OL'].includes(list.tagName)) return '';
    return getComputedStyle(list).display === 'none' ? ' collapsed' : ' expanded';
  };
  const lines = [];
  let more = 0;
  const emit = (line) => { if (lines.length < maxLines) lines.push(line); else more++; };
  const labelled = new Set();  // labels whose text is already the name of their control
  const focus = document.activeElement;
  const walk = (el) => {
    if (pruned(el)) return;
    const presentational = ['presentation', 'none'].includes(el.getAttribute('role'));
    if (el.matches(interactive) && !presentational && shown(el)) {
      const r = role(el);
      let line = `${r} '${clean(name(el))}' id=${idOf(el)}`;
      const tag = el.tagName.toLowerCase();
      if (tag === 'input' && (el.type === 'checkbox' || el.type === 'radio')) {
        if (el.checked) line += ' checked';
      } else if (tag === 'select') {
        const chosen = el.options[el.selectedIndex];
        if (chosen) line += ` value='${clean(chosen.text)}'`;
      } else if ((tag === 'input' || tag === 'textarea') && el.value) {
        const shownValue = el.type === 'password' ? '*'.repeat(el.value.length) : el.value;
        line += ` value='${clean(shownValue)}'`;
      }
      if (tag === 'textarea') line += ' multiline';
      if (el.disabled) line += ' disabled';
      if (el === focus) line += ' focused';
      emit(line);
      if (el.labels) for (const l of el.labels) labelled.add(l);
      if (tag === 'select') {
        for (const o of el.options) {
          emit(`option '${clean(o.text)}' id=${idOf(o)}` + (o.selected ? ' selected' : ''));
        }
        return;
      }
      if (tag !== 'div' && tag !== 'span' && tag !== 'li') return;  // its text is its name
    }
    for (const child of el.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) {
        const text = clean(child.textContent);
        if (!text || el.matches(interactive) || !textShown(child)) continue;
        const label = el.closest('label');
        if (label && labelled.has(label)) continue;
        const pointer = getComputedStyle(el).cursor === 'pointer' ? ' clickable' : '';
        emit(`StaticText '${text}' id=${idOf(el)}${pointer}${openness(el)}`);
      } else if (child.nodeType === Node.ELEMENT_NODE) {
        walk(child);
      }
    }
  };
  // Labels listed after their control are known by then; a label before its control
  // is found here first, so its control's name is not repeated as static text.
  for (const l of document.querySelectorAll('label')) {
    if (l.control) labelled.add(l);
  }
  if (document.body) walk(document.body);
  if (more) lines.push(`... (${more} more lines)`);
  return lines.join('\n');
}
"""


async def page_text(page: Any, *, skip: str = "", max_lines: int = _MAX_LINES) -> str:
    """The text of ``page`` (module docstring), one line per element or static text.

    Args:
        page: a Playwright page.
        skip: a CSS selector; elements it matches and everything under them are left
            out (MiniWoB leaves out its goal line and its score display).
        max_lines: the most lines (``... (N more lines)`` says how many were cut).

    Side effect: elements seen for the first time get their ``data-rsid`` id.
    """
    if isinstance(max_lines, bool) or not isinstance(max_lines, int) or max_lines < 1:
        raise ValueError(f"max_lines must be an int >= 1, got {max_lines!r}")
    return str(await page.evaluate(_PAGE_TEXT_JS, [skip, max_lines, _MAX_NAME]))


def element_selector(element_id: str) -> str:
    """The CSS selector of the element with this id (``[data-rsid="12"]``)."""
    return f"[{ID_ATTRIBUTE}={json.dumps(str(element_id))}]"


@dataclass(frozen=True, slots=True)
class PageElement:
    """One line of :func:`page_text`: ``role 'name' id=N`` and its states."""

    role: str
    name: str
    element_id: str
    states: tuple[str, ...] = ()
    value: str | None = None


_LINE = re.compile(r"^(\S+) '(.*)' id=(\d+)((?: \S+)*?)(?: value='(.*)')?((?: \S+)*)$")


def parse_page_text(text: str | None) -> list[PageElement]:
    """The lines of a :func:`page_text` text as :class:`PageElement` (other lines skipped)."""
    out: list[PageElement] = []
    for raw in (text or "").splitlines():
        match = _LINE.match(raw.strip())
        if match is None:
            continue
        role, name, element_id, before, value, after = match.groups()
        states = tuple((before + " " + after).split())
        out.append(PageElement(role, name, element_id, states, value))
    return out
