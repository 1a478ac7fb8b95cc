"""How bundled-site tasks name the server: the `__SITES__` placeholder, its binding to a session, the site check.

A leaf below both `tasks` (which writes the placeholder into the suites and validates task files) and `server`
(which binds tasks to sessions), so neither needs the other.
"""

from __future__ import annotations

import urllib.parse

from jaxagent.types import Task

PLACEHOLDER = "__SITES__"
BUNDLED_SITES = ("shop", "forum", "settings", "launcher")
OTHER_SITES = ("web", "miniwob")  # the live web (WebVoyager / WebArena files) and MiniWoB++


def resolve(url: str, base_url: str, session: str) -> str:
  """`url` with the placeholder replaced by the session's root on the server at `base_url`."""
  return url.replace(PLACEHOLDER, f"{base_url.rstrip('/')}/s/{session}")


def check_site(task: Task) -> None:
  """Fails before any browser starts when the task names a site nobody serves."""
  if task.site not in BUNDLED_SITES + OTHER_SITES:
    raise ValueError(f"task {task.id!r}: field 'site' is {task.site!r}, which no environment serves; use one of "
                     f"{list(BUNDLED_SITES + OTHER_SITES)}")
  if task.site in BUNDLED_SITES and PLACEHOLDER not in task.start_url:
    raise ValueError(f"task {task.id!r}: field 'start_url' {task.start_url!r} of a bundled site must start with "
                     f"{PLACEHOLDER!r} (e.g. '{PLACEHOLDER}/{task.site}/') so it binds to an episode's session")


def shows(ref: str, url: str) -> bool:
  """Whether the page at site-relative `url` is the one `ref` names, "GOLD in PRED": the same path (a trailing
  slash aside) and every query value of `ref` present (how an expert knows a navigation step is already done)."""
  gold, pred = urllib.parse.urlsplit(ref), urllib.parse.urlsplit(url)
  if (gold.path.rstrip("/") or "/") != (pred.path.rstrip("/") or "/"):
    return False
  have = urllib.parse.parse_qs(pred.query)
  return all(any(v in have.get(k, []) for v in vals) for k, vals in urllib.parse.parse_qs(gold.query).items())
