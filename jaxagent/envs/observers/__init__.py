"""Observers: what an agent format sees of a page.

Each observer fills fields of one `jaxagent.types.Observation` and returns the elements its numbering refers
to, so that an action naming element N resolves to the same thing the agent saw:
- `som`: WebVoyager's set-of-marks labels and textual element list (ids from 0), `reference/algorithms.md` §1.2;
- `a11y`: the CDP accessibility tree in OpenWebVoyager's form (ids from 1), §1.2;
- `html`: WebRL's simplified HTML with `id="N"` on interactive elements (ids from 0), §3.2;
- `screenshot`: the page as a uint8 array (used by all of them when the profile takes screenshots).
"""

from __future__ import annotations

import functools
import pathlib

OBSERVERS = ("som", "a11y", "html")

_JS_DIR = pathlib.Path(__file__).resolve().parent.parent / "js"


@functools.cache
def load_js(name: str) -> str:
  """The source of `jaxagent/envs/js/<name>.js`, a function expression for `Page.evaluate`."""
  return (_JS_DIR / f"{name}.js").read_text()
