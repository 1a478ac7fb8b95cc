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
  """The current viewport bbox of `[data-label-id=index]`, None if it is gone. An element whose centre is off
  screen or under another element (a fixed banner) is scrolled to the middle of the viewport first, so the click
  lands on what the id names whenever the page lets it."""
  return page.evaluate(
      """(i) => { const el = document.querySelector(`[data-label-id="${i}"]`);
                  if (!el) return null;
                  const clear = () => {
                    const r = el.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
                    if (x < 0 || y < 0 || x >= window.innerWidth || y >= window.innerHeight) return false;
                    const top = document.elementFromPoint(x, y);
                    return !!top && (top === el || el.contains(top));
                  };
                  if (!clear()) el.scrollIntoView({block: 'center', inline: 'center'});
                  const r = el.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }""", index)
