"""`SiteTextEnv`: the bundled sites without a browser, for agents that read WebRL's simplified HTML.

Each episode is a session on the same site server Chromium talks to (`server.episode_task`), so the judges read
the same state. The env does what Chromium does with the sites' script-free pages: it requests a page over HTTP,
follows redirects, keeps the back/forward history and the controls' live values, submits forms as the HTML spec
serialises them (implicit submission on Enter included), and renders each page through `textpage.Page`, which
reproduces `js/html.js` byte for byte but for `data-bbox`. Actions name elements by their html id; scrolling
(the phone's: a swipe), hovering and waiting change nothing a text agent sees. `BrowserEnv`'s rules hold: a failed
action feeds back `FAIL_OBS`, typing into a non-text box warns, `back` never leaves the first page, navigation
stays on the server's origin.

Parity with Chromium (prompts and server state, step by step) is tested in `tests/envs/sites/test_text_env.py`.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import httpx
from selectolax.lexbor import LexborNode

from jaxagent.envs import profiles as profiles_lib
from jaxagent.envs import egress
from jaxagent.envs.browser import FAIL_OBS, TYPE_WARNING, _TEXT_INPUT_TYPES, blocked_message, types_as_text
from jaxagent.envs.sites import server as server_lib
from jaxagent.envs.sites import textpage
from jaxagent.envs.sites.expert import target_selectors
from jaxagent.types import Action, ActionKind, Observation, Task

# Inputs whose Enter submits a form that has no submit button, when the form has exactly one of them (HTML
# spec, "implicit submission").
_BLOCKS_IMPLICIT = {"text", "search", "url", "tel", "email", "password", "date", "month", "week", "time",
                    "datetime-local", "number"}
_NOT_SUBMITTED = {"submit", "reset", "button", "image", "file"}
_SAFE = re.compile(r"[A-Za-z0-9*\-._]")


def form_urlencode(pairs: list[tuple[str, str]]) -> str:
  """application/x-www-form-urlencoded as browsers write it (`*-._` and alphanumerics kept, space as `+`)."""
  def enc(s: str) -> str:
    return "".join(c if _SAFE.fullmatch(c) else "+" if c == " " else
                   "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in s)
  return "&".join(f"{enc(k)}={enc(v)}" for k, v in pairs)


def _type_of(node: LexborNode) -> str:
  return (node.attributes.get("type") or "").lower()


def _is_textbox(node: LexborNode) -> bool:
  """What typed keys go into: a text area or a text-like input, one without a `type` included (the warning's
  stricter rule, `types_as_text`, is WebVoyager's)."""
  return node.tag == "textarea" or (node.tag == "input" and (_type_of(node) or "text") in _TEXT_INPUT_TYPES)


def _is_submit(node: LexborNode) -> bool:
  return ((node.tag == "button" and _type_of(node) in ("", "submit"))
          or (node.tag == "input" and _type_of(node) in ("submit", "image")))


def _ancestors_or_self(node: LexborNode):
  while node is not None:
    yield node
    node = node.parent


class SiteTextEnv:
  """The sites' pages as simplified HTML, with no browser (the `jaxagent.types.Env` protocol).

  Args: `profile` (web | text | device: only the viewport an observation reports changes), `observation`
  (must be "html"), `oracle_targets` (annotate observations for the scripted expert, as `SiteEnv`), `base_url`
  (a running site server; default: this process's), `timeout` (s, per request). Other `SiteEnv` options that
  only concern pixels (`screenshot_size`, `som_draw`, ...) are accepted and unused.
  """

  def __init__(self, profile: str | None = None, observation: str = "html", oracle_targets: bool = False,
               base_url: str | None = None, timeout: float = 30.0, max_text: int = 200, **pixel_options: Any):
    if observation != "html":
      raise ValueError(f"observation={observation!r}: the text backend renders the simplified HTML only "
                       "(observation='html'); use Chromium (env.browser='chromium') for screenshots, set-of-marks "
                       "or the accessibility tree")
    self._fixed_profile = profiles_lib.get_profile(profile) if profile is not None else None
    self.profile = self._fixed_profile or profiles_lib.PROFILES["text"]
    self.observation, self.oracle_targets, self.base_url = observation, oracle_targets, base_url
    self.max_text = max_text
    self._client = httpx.Client(timeout=timeout)
    self.bound_task: Task | None = None
    self._task: Task | None = None
    self._history: list[str] = []
    self._index = -1
    self._page: textpage.Page | None = None
    self._url = ""
    self._focus: int | None = None  # node order of the focused control
    self._warning = ""
    self._steps, self._done = 0, True

  # ------------------------------------------------------------------------------------------- protocol

  def reset(self, task: Task) -> Observation:
    self.bound_task = server_lib.episode_task(task, base_url=self.base_url)
    task = self._task = self.bound_task
    if task.meta.get("session") is None:
      raise ValueError(f"Task {task.id!r} is not a bundled-site task; the text backend serves the bundled sites "
                       "only (env.browser='chromium' for others)")
    self.profile = self._fixed_profile or profiles_lib.get_profile(task.profile)
    self._history, self._index = [], -1
    self._steps, self._done = 0, False
    self._navigate("GET", task.start_url)
    return self._observe()

  def step(self, action: Action) -> tuple[Observation, float, bool, dict[str, Any]]:
    if self._task is None:
      raise RuntimeError("SiteTextEnv.step called before reset(task)")
    if self._done:
      raise RuntimeError("SiteTextEnv.step called after the episode ended; call reset(task)")
    self._steps += 1
    self._warning = ""
    error, blocked, answer = "", [], None
    if action.kind == ActionKind.INVALID:
      error = action.reason or FAIL_OBS
    elif action.ends_episode:
      answer = action.text
    else:
      try:
        blocked = self._execute(action)
      except _Failed:
        error = FAIL_OBS
    done = action.ends_episode
    truncated = not done and self._steps >= self._task.max_steps
    obs = self._observe()
    error = error or blocked_message(blocked, tuple(self._task.allowed_origins))
    obs.error = error
    if self._warning:
      obs.extra["warning"] = self._warning
    self._done = done or truncated
    info = {"url": obs.url, "error": error, "error_detail": error if error == FAIL_OBS else "", "answer": answer,
            "steps": self._steps, "truncated": truncated, "downloads": [], "blocked": blocked, "refused": [],
            "warning": self._warning, "session": self._task.meta["session"],
            "state_url": self._task.meta["state_url"]}
    return obs, 0.0, self._done, info

  def close(self) -> None:
    self._client.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # ----------------------------------------------------------------------------------------- navigation

  def _request(self, method: str, url: str, body: str | None = None) -> str:
    """The page at the end of `url`'s redirects; sets `_url` and a new `_page`."""
    for _ in range(20):
      headers = {"content-type": "application/x-www-form-urlencoded"} if body is not None else None
      r = self._client.request(method, url, content=body, headers=headers)
      if r.status_code in (301, 302, 303, 307, 308) and "location" in r.headers:
        url = urllib.parse.urljoin(url, r.headers["location"])
        if r.status_code not in (307, 308):
          method, body = "GET", None
        continue
      self._url, self._page, self._focus = url, textpage.Page(r.text), None
      return url
    raise RuntimeError(f"{url}: too many redirects")

  def _navigate(self, method: str, url: str, body: str | None = None) -> None:
    """A new history entry, except that a GET of the current URL replaces it (Chromium's same-URL rule)."""
    same = method == "GET" and 0 <= self._index and url == self._history[self._index]
    self._request(method, url, body)
    if same:
      self._history[self._index] = self._url
      return
    del self._history[self._index + 1:]
    self._history.append(self._url)
    self._index = len(self._history) - 1

  def _traverse(self, delta: int) -> None:
    """Back or forward asks the server again, as Chromium under Playwright does (no back-forward cache); back
    from the first page goes to the tab's blank page and forward again, which reloads it too."""
    target = self._index + delta
    if not 0 <= target < len(self._history):
      if delta < 0:
        self._request("GET", self._history[self._index])
        self._history[self._index] = self._url
      return
    self._index = target
    self._request("GET", self._history[target])
    self._history[target] = self._url

  def _allowed(self, url: str) -> bool:
    return egress.allowed(url, self._task.allowed_origins)

  def _goto(self, url: str) -> list[str]:
    url = urllib.parse.urljoin(self._url, url)
    if not self._allowed(url):
      return [url]
    self._navigate("GET", url)
    return []

  # ------------------------------------------------------------------------------------------- actions

  def _node(self, action: Action) -> LexborNode:
    if action.element is None:
      raise _Failed()
    node = self._page.node_of(action.element)
    if node is None:
      raise _Failed()
    return node

  def _execute(self, action: Action) -> list[str]:
    kind = action.kind
    if kind == ActionKind.CLICK:
      return self._click(self._node(action))
    if kind == ActionKind.TYPE:
      return self._type(action)
    if kind == ActionKind.SELECT:
      return self._select(self._node(action), action.text)
    if kind == ActionKind.SCROLL:
      if (action.direction.lower() or "down") not in ("up", "down", "left", "right"):
        raise _Failed()
      if action.element is not None:
        self._node(action)
      return []
    if kind == ActionKind.HOVER:
      self._node(action)
      return []
    if kind == ActionKind.KEY:
      if not action.key:
        raise _Failed()
      return self._enter() if action.key.lower() in ("enter", "return") else []
    if kind == ActionKind.BACK:
      self._traverse(-1)
      return []
    if kind == ActionKind.FORWARD:
      self._traverse(+1)
      return []
    if kind == ActionKind.HOME:
      return self._goto(self._task.meta.get("home_url") or self._task.start_url)
    if kind == ActionKind.RESTART:
      return self._goto(self._task.start_url)
    if kind == ActionKind.GOTO:
      if not action.url:
        raise _Failed()
      return self._goto(action.url)
    if kind in (ActionKind.WAIT, ActionKind.NOOP):
      return []
    if kind == ActionKind.SWIPE and self._travel_sq(action) >= 10:  # BrowserEnv's rule: shorter is a tap
      return []  # the phone's scroll: like SCROLL, it moves nothing a simplified-HTML agent sees
    raise _Failed()  # screen points (a tap at a point) need a layout: Chromium's business

  def _travel_sq(self, action: Action) -> float:
    """A swipe's squared travel in CSS px (the page is never zoomed on the sites: their viewport is the device's)."""
    if None in (action.x, action.y, action.x2, action.y2):
      raise _Failed()
    scale = (self.profile.width, self.profile.height) if action.normalized else (1.0, 1.0)
    return ((action.x2 - action.x) * scale[0]) ** 2 + ((action.y2 - action.y) * scale[1]) ** 2

  def _click(self, node: LexborNode) -> list[str]:
    """A click's default action: the link or submit button it lands in, a box it ticks, a control it focuses."""
    page = self._page
    for n in _ancestors_or_self(node):
      tag, typ = n.tag, _type_of(n)
      if tag == "a" and n.attributes.get("href") is not None:
        return self._goto(n.attributes["href"])
      if tag == "button" or (tag == "input" and typ in ("submit", "image", "checkbox", "radio", "reset", "button")):
        if n.attributes.get("disabled") is not None:
          return []
        self._focus = page.order(n)
        if tag == "input" and typ == "checkbox":
          page.live.checked[page.order(n)] = not page.checked(n)
          return []
        if tag == "input" and typ == "radio":
          self._check_radio(n)
          return []
        if _is_submit(n):
          form = self._form_of(n)
          return self._submit(form, n) if form is not None else []
        return []
      if tag in ("input", "textarea", "select"):
        self._focus = page.order(n)
        return []
      if tag == "label":
        control = self._label_control(n)
        return self._click(control) if control is not None and control.mem_id != node.mem_id else []
    self._focus = None
    return []

  def _type(self, action: Action) -> list[str]:
    page = self._page
    if action.element is not None:
      node = self._node(action)
      if not types_as_text(node.tag, node.attributes.get("type")):
        self._warning = TYPE_WARNING.format(tag=node.tag, type=node.attributes.get("type"))
      blocked = self._click(node)
      if self._page is not page:
        return blocked  # the click navigated: the keys go to the new page's body
    focused = page.nodes[self._focus] if self._focus is not None else None
    if focused is not None and _is_textbox(focused):
      page.live.values[self._focus] = action.text
    return self._enter() if action.enter else []

  def _enter(self) -> list[str]:
    page = self._page
    focused = page.nodes[self._focus] if self._focus is not None else None
    if focused is None:
      return []
    if focused.tag == "textarea":
      page.live.values[self._focus] = page.value(focused) + "\n"
      return []
    if focused.tag == "button" or _is_submit(focused):
      return self._click(focused)
    if focused.tag != "input" or (_type_of(focused) or "text") not in _BLOCKS_IMPLICIT | {"checkbox", "radio"}:
      return []
    form = self._form_of(focused)
    if form is None:
      return []
    controls = self._controls(form)
    submit = next((c for c in controls if _is_submit(c)), None)
    if submit is not None:
      return [] if submit.attributes.get("disabled") is not None else self._submit(form, submit)
    blocking = [c for c in controls if c.tag == "input" and (_type_of(c) or "text") in _BLOCKS_IMPLICIT]
    return self._submit(form, None) if len(blocking) == 1 else []

  def _select(self, node: LexborNode, text: str) -> list[str]:
    select = next((n for n in _ancestors_or_self(node) if n.tag == "select"), None) or next(
        (n for n in node.traverse() if n.tag == "select"), None)
    if select is None:
      raise _Failed()
    want = text.lower()
    for k, option in enumerate(textpage.options_of(select)):
      if want in textpage.option_text(option).lower():
        self._page.live.selected[self._page.order(select)] = k
        return []
    raise _Failed()

  # ---------------------------------------------------------------------------------------------- forms

  def _form_of(self, node: LexborNode) -> LexborNode | None:
    return next((n for n in _ancestors_or_self(node.parent) if n.tag == "form"), None)

  @staticmethod
  def _controls(form: LexborNode) -> list[LexborNode]:
    return [n for n in form.traverse() if n.tag in ("input", "button", "select", "textarea")]

  def _label_control(self, label: LexborNode) -> LexborNode | None:
    target = label.attributes.get("for")
    if target:
      return self._page.tree.css_first(f"[id='{target}']")
    return next((n for n in label.traverse() if n.tag in ("input", "button", "select", "textarea")
                 and n.mem_id != label.mem_id), None)

  def _check_radio(self, node: LexborNode) -> None:
    page, name = self._page, node.attributes.get("name")
    form = self._form_of(node)
    group = self._controls(form) if form is not None else [node]
    for other in group:
      if other.tag == "input" and _type_of(other) == "radio" and name and other.attributes.get("name") == name:
        page.live.checked[page.order(other)] = False
    page.live.checked[page.order(node)] = True

  def _submit(self, form: LexborNode, submitter: LexborNode | None) -> list[str]:
    page, pairs = self._page, []
    for c in self._controls(form):
      name, typ = c.attributes.get("name"), _type_of(c)
      if not name or c.attributes.get("disabled") is not None:
        continue
      if c.tag == "button" or (c.tag == "input" and typ in _NOT_SUBMITTED):
        if submitter is not None and c.mem_id == submitter.mem_id:
          pairs.append((name, page.value(c) if c.tag == "input" else (c.attributes.get("value") or "")))
        continue
      if c.tag == "input" and typ in ("checkbox", "radio"):
        if page.checked(c):
          pairs.append((name, page.value(c)))
        continue
      if c.tag == "select":
        if page.value(c) or textpage.options_of(c):
          pairs.append((name, page.value(c)))
        continue
      value = page.value(c)
      if c.tag == "textarea":
        value = value.replace("\r\n", "\n").replace("\n", "\r\n")
      pairs.append((name, value))
    action = form.attributes.get("action") or self._url
    method = (form.attributes.get("method") or "get").lower()
    if submitter is not None:
      action = submitter.attributes.get("formaction") or action
      method = (submitter.attributes.get("formmethod") or method).lower()
    url = urllib.parse.urljoin(self._url, action)
    if not self._allowed(url):
      return [url]
    if method == "post":
      self._navigate("POST", url, form_urlencode(pairs))
    else:
      parts = urllib.parse.urlsplit(url)
      self._navigate("GET", urllib.parse.urlunsplit(parts._replace(query=form_urlencode(pairs))))
    return []

  # ------------------------------------------------------------------------------------------- observing

  def _observe(self) -> Observation:
    task, page = self._task, self._page
    html, elements = page.simplify(self.max_text)
    obs = Observation(url=self._url, title=page.title, intent=task.intent, step=self._steps, html=html,
                      elements=elements, viewport=(self.profile.width, self.profile.height))
    obs.extra["session"] = task.meta["session"]
    obs.extra["state_url"] = task.meta["state_url"]
    if self.oracle_targets and task.oracle:
      selectors = target_selectors(task.oracle)
      obs.extra["oracle"] = task.oracle
      obs.extra["oracle_targets"] = {sel: page.target(sel) for sel in selectors}
      obs.extra["scroll"] = (0, 0)
    return obs


class _Failed(Exception):
  """The action cannot be executed here (Chromium's `ActionFailed`)."""
