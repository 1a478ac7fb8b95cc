"""`SiteEnv`: the browser environment bound to the bundled sites, with the oracle's targets for the expert.

It is `BrowserEnv` plus two things: `reset` binds a bundled-site task to a fresh session on this process's
site server (`episode_task`), and, when `oracle_targets` is on, every observation carries privileged
information for the scripted expert in `obs.extra`: the task's oracle and, per oracle selector, the viewport
box of the first visible element it matches. Models never see `extra`; the expert turns a box into the element
id of whichever observer the agent format uses (set-of-marks, accessibility tree, simplified HTML) or into an
AitW touch point.
"""

from __future__ import annotations

from typing import Any

from jaxagent.envs.browser import BrowserEnv
from jaxagent.envs.sites import server as server_lib
from jaxagent.envs.sites.expert import target_selectors
from jaxagent.types import Observation, Task

# For each selector: the first matching element that is rendered, its viewport box, whether another element
# covers its centre (a fixed banner), and the page's scroll room, so the expert knows which way to scroll.
_TARGETS_JS = """(selectors) => {
  const out = {};
  for (const sel of selectors) {
    let found = null;
    for (const el of document.querySelectorAll(sel)) {
      const r = el.getBoundingClientRect();
      if (r.width <= 0 || r.height <= 0) continue;
      const style = getComputedStyle(el);
      if (style.visibility === 'hidden' || style.display === 'none') continue;
      const cx = r.left + r.width / 2, cy = r.top + r.height / 2;
      const inView = cy >= 0 && cy <= window.innerHeight && cx >= 0 && cx <= window.innerWidth;
      const top = inView ? document.elementFromPoint(cx, cy) : null;
      found = {bbox: [r.left, r.top, r.width, r.height], in_view: inView,
               covered: inView && !!top && top !== el && !el.contains(top) && !top.contains(el),
               tag: el.tagName.toLowerCase(), text: (el.innerText || el.value || '').trim().slice(0, 100)};
      break;
    }
    out[sel] = found;
  }
  return {targets: out, scroll_y: window.scrollY,
          max_scroll_y: document.documentElement.scrollHeight - window.innerHeight};
}"""


class SiteEnv(BrowserEnv):
  """`BrowserEnv` for bundled-site tasks (other tasks pass through unchanged).

  Args: those of `BrowserEnv`, plus `oracle_targets` (annotate observations for the scripted expert) and
  `base_url` (a running site server; default: this process's `ensure_server()`).
  """

  def __init__(self, *args: Any, oracle_targets: bool = False, base_url: str | None = None, **kwargs: Any):
    super().__init__(*args, **kwargs)
    self.oracle_targets = oracle_targets
    self.base_url = base_url
    self.bound_task: Task | None = None

  def reset(self, task: Task) -> Observation:
    self.bound_task = server_lib.episode_task(task, base_url=self.base_url)
    return super().reset(self.bound_task)

  def step(self, action):
    obs, reward, done, info = super().step(action)
    if self.bound_task is not None and "session" in self.bound_task.meta:
      info["session"] = self.bound_task.meta["session"]
      info["state_url"] = self.bound_task.meta["state_url"]
    return obs, reward, done, info

  def _observe(self) -> Observation:
    obs = super()._observe()
    task = self._task
    if task is not None and "session" in task.meta:
      obs.extra["session"] = task.meta["session"]
      obs.extra["state_url"] = task.meta["state_url"]
    if self.oracle_targets and task is not None and task.oracle:
      selectors = target_selectors(task.oracle)
      found = self._page.evaluate(_TARGETS_JS, selectors)
      obs.extra["oracle"] = task.oracle
      obs.extra["oracle_targets"] = found["targets"]
      obs.extra["scroll"] = (found["scroll_y"], found["max_scroll_y"])
    return obs
