"""Set-of-marks labelling and WebVoyager's textual element list (`reference/algorithms.md` §1.2).

The candidate rules, visibility test, nesting removal and label drawing run in the page (`js/som.js`, after
`MinorJerry/WebVoyager:utils.py:get_web_element_rect`); the textual list is built here exactly as
WebVoyager's Python does, so prompts are byte-compatible.
"""

from __future__ import annotations

from typing import Any

from jaxagent.envs.observers import load_js
from jaxagent.types import Element

_TEXT_INPUT_TYPES = ("text", "search", "password", "email", "tel")


def mark(page, draw: bool = True, fix_color: bool = True) -> list[dict[str, Any]]:
  """Numbers the page's interactive elements; with `draw`, leaves WebVoyager's overlays on the page."""
  return page.evaluate(load_js("som"), {"draw": draw, "fixColor": fix_color})


def clear(page) -> None:
  """Removes the overlays `mark` drew (after the screenshot, as WebVoyager does after the model call)."""
  page.evaluate(load_js("som_clear"))


def to_elements(records: list[dict[str, Any]]) -> list[Element]:
  """Page records -> `Element`s; an element's bbox is its first visible client rect (viewport CSS px)."""
  elements = []
  for i, r in enumerate(records):
    attrs = {k: v for k, v in (("type", r.get("type")), ("aria-label", r.get("ariaLabel"))) if v}
    elements.append(Element(index=i, tag=r["tag"], text=r["text"], bbox=tuple(r["rects"][0]), role=r.get("role", ""),
                            attrs=attrs))
  return elements


def format_element_text(records: list[dict[str, Any]]) -> str:
  """WebVoyager's companion list: `[i]: <tag> "text";` entries joined by tabs (utils.py:get_web_element_rect).

  Elements without text appear only when they are text inputs, textareas or buttons (then with their
  aria-label); text of 200+ characters or holding an `<img ... src=` is dropped; an aria-label that differs
  from the text is appended.
  """
  out = []
  for i, r in enumerate(records):
    text, tag, typ, aria = r["text"], r["tag"], r.get("type"), r.get("ariaLabel")
    if not text:
      if ((tag == "input" and typ in _TEXT_INPUT_TYPES) or tag == "textarea"
          or (tag == "button" and typ in ("submit", "button"))):
        out.append(f'[{i}]: <{tag}> "{aria}";' if aria else f'[{i}]: <{tag}> "{text}";')
    elif len(text) < 200 and not ("<img" in text and "src=" in text):
      suffix = f', "{aria}"' if aria and aria != text else ""
      if tag in ("button", "input", "textarea"):
        out.append(f'[{i}]: <{tag}> "{text}"{suffix};')
      else:
        out.append(f'[{i}]: "{text}"{suffix};')
  return "\t".join(out)
