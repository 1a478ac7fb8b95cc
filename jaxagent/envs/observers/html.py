"""WebRL's simplified HTML observation (`reference/algorithms.md` §3.2), computed in the page by `js/html.js`.

Interactive elements are numbered from 0 in document order, carry `data-label-id=N` on the live page (so an
action resolves N to the element's live bounding box, as WebRL does) and `id="N"` in the text.
"""

from __future__ import annotations

from jaxagent.envs.observers import load_js
from jaxagent.types import Element


def simplify(page, max_text: int = 200) -> tuple[str, list[Element]]:
  out = page.evaluate(load_js("html"), {"maxText": max_text})
  elements = [Element(index=e["index"], tag=e["tag"], text=e["text"], bbox=tuple(e["bbox"]), role=e["role"],
                      attrs=e["attrs"]) for e in out["elements"]]
  return out["html"], elements


def live_bbox(page, index: int) -> tuple[float, float, float, float] | None:
  """The current viewport bbox of `[data-label-id=index]`, scrolled into view first; None if it is gone."""
  return page.evaluate(
      """(i) => { const el = document.querySelector(`[data-label-id="${i}"]`);
                  if (!el) return null;
                  el.scrollIntoView({block: 'nearest', inline: 'nearest'});
                  const r = el.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }""", index)
