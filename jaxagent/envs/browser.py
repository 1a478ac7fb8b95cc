"""`BrowserEnv`: one real Chromium driven by sync Playwright, executing every `ActionKind`.

One browser per env object (one per pool worker), launched once; every `reset(task)` starts the episode in a
clean tab of an emptied context (cookies, storage, history, windows all new; `fresh_context=True` opens a new
context instead) without relaunching. Instead of the originals' fixed 3-10 s
sleeps (`reference/algorithms.md` §1.3), an action is followed by one zero-delay task turn (the handlers,
microtasks and timers it queued run) and, only if it started a navigation or opened a window, a capped wait for
`load` (plus, optionally, `networkidle`).

Behaviour worth knowing:
- Navigation and every request are confined to the task's allowed origins (`Task.allowed_origins`, default the
  start URL's origin; `*` may stand for host labels or the whole port, `jaxagent.envs.egress`). Routing answers a
  blocked navigation with HTTP 204, so the page stays where it was, and the observation's `error` says why;
  blocked sub-resources are aborted. Underneath, all the context's traffic goes through a loopback egress proxy
  that connects only to allowed origins (redirect hops, WebSockets, service workers, preconnects included) and
  answers speculative loads (speculation-rules or `<link>` prefetch and prerender) 503, so no server sees a page
  the agent did not open; a main-frame document that commits outside the allowlist
  anyway is left for the last allowed page. `info["blocked"]` lists the blocked navigations of a step,
  `info["refused"]` every request or connection the proxy refused.
- New windows/tabs: the new page becomes the active page (WebRL's behaviour, §3.3); the opener stays open.
  If the active page closes itself, the last remaining page becomes active.
- Downloads are accepted into a per-env temp dir and listed in `obs.extra["downloads"]` / `info["downloads"]`.
- Dialogs (alert / confirm / prompt) are accepted.
- An element index refers to the numbering of the env's observer (`observation="som"|"a11y"|"html"`) at the
  last observation; it resolves to its bbox centre (for `html`, the live `[data-label-id=N]` box, as WebRL).
- A failing action never raises: `Observation.error` gets WebVoyager's `fail_obs` text (`FAIL_OBS`). Typing
  into something that is not a text box still types, and `obs.extra["warning"]` carries WebVoyager's `warn_obs`.
  `step` raises `BrowserCrashed` when the browser process or the page's renderer died; the next `reset`
  relaunches the browser (or just opens a fresh context, if only a renderer died).
- `home` opens `task.meta["home_url"]` (the device launcher) or else the start page; `restart` opens the start
  page (OpenWebVoyager's Restart, which went to google.com); `back` never leaves the start page for about:blank.
- Coordinates: `normalized` points (AitW's touch points) are fractions of the screen the screenshot shows;
  unnormalised ones and element boxes are CSS px of the layout viewport (what `getBoundingClientRect` gives).
"""

from __future__ import annotations

import atexit
import logging
import os
import pathlib
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
from typing import Any

import psutil
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import sync_playwright

from jaxagent import secrets
from jaxagent.envs import egress, tempdirs
from jaxagent.envs import profiles as profiles_lib
from jaxagent.envs.observers import OBSERVERS
from jaxagent.envs.observers import a11y as a11y_obs
from jaxagent.envs.observers import html as html_obs
from jaxagent.envs.observers import screenshot as screenshot_obs
from jaxagent.envs.observers import som as som_obs
from jaxagent.types import Action, ActionKind, Element, Observation, Task

log = logging.getLogger(__name__)

# WebVoyager / OpenWebVoyager's text for an action that could not be executed (§2.2).
FAIL_OBS = ("The action you have chosen cannot be executed. Please double-check if you have selected the correct "
            "element or used correct action format. Then provide the revised Thought and Action.\n")
# WebVoyager's `warn_obs` when typing into something that is not a text box (run.py:exec_action_type).
TYPE_WARNING = ("note: The web element you're trying to type may not be a textbox, and its tag name is <{tag}>, "
                "type is {type}.")
_TEXT_INPUT_TYPES = ("text", "search", "password", "email", "tel")
DEBIAN_CHROMIUM = "/usr/bin/chromium"
# The observation modes: an element-numbering observer, or the screen alone.
OBSERVATIONS = OBSERVERS + ("screenshot",)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
_KEY_NAMES = {"enter": "Enter", "return": "Enter", "tab": "Tab", "escape": "Escape", "esc": "Escape",
              "backspace": "Backspace", "delete": "Delete", "space": " ", "up": "ArrowUp", "down": "ArrowDown",
              "left": "ArrowLeft", "right": "ArrowRight", "pageup": "PageUp", "pagedown": "PageDown",
              "home": "Home", "end": "End"}
# Counts navigations the document starts (Navigation API `navigate` fires synchronously in the page, before the
# request reaches Playwright), so `_settle` knows to wait for one.
_NAV_SPY_JS = """(() => {
  const bump = (k) => { window[k] = (window[k] || 0) + 1; };
  if (window.navigation) window.navigation.addEventListener('navigate', (e) => {
    if (!e.downloadRequest) bump('__jaxagentNav'); });
  const open = window.open;
  window.open = function (...args) { bump('__jaxagentPopup'); return open.apply(this, args); };
  document.addEventListener('click', (e) => {
    const a = e.target && e.target.closest && e.target.closest('a[href], area[href]');
    if (a && a.target && !['_self', '_top', '_parent'].includes(a.target)) bump('__jaxagentPopup');
  }, true);
  // Whether a scroll of the page or of any element is under way (a fling included): `scrollend` ends it.
  addEventListener('scroll', () => { window.__jaxagentScrolling = true; }, {capture: true, passive: true});
  addEventListener('scrollend', () => { window.__jaxagentScrolling = false; }, {capture: true, passive: true});
})();"""
_SETTLE_JS = """() => new Promise((r) => setTimeout(() => {
  const out = [window.__jaxagentNav || 0, window.__jaxagentPopup || 0];
  window.__jaxagentNav = 0; window.__jaxagentPopup = 0; r(out); }, 0))"""


# A touch swipe's drag, start to end: Appium's pointer move (DigiRL's `driver.swipe`, no duration given).
SWIPE_SECONDS = 0.25

# A fling or a smooth scroll goes on after the input ends: wait until no scroll is under way (the last one's
# `scrollend` came, `_NAV_SPY_JS`) and the position has held for three frames (at most ~3 s), so the next
# observation's boxes are where a tap will land. The position alone can hold for three frames mid-fling on a busy
# machine, and the next swipe's touch then stops the fling where it happens to be.
_SCROLL_STILL_JS = """() => new Promise(resolve => {
  let last = null, still = 0, frames = 0;
  const tick = () => {
    const here = [window.scrollX, window.scrollY].join();
    still = here === last ? still + 1 : 0;
    last = here;
    if ((still >= 3 && !window.__jaxagentScrolling) || ++frames > 180) resolve(frames);
    else requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})"""

class BrowserCrashed(RuntimeError):
  """The Chromium process behind an env died; `reset` relaunches it (the pool retries the episode)."""


class ActionFailed(Exception):
  """An action that cannot be carried out; its message becomes `Observation.error`."""

  def __init__(self, message: str = FAIL_OBS):
    super().__init__(message)


# ------------------------------------------------------------------------------ one Playwright per process

_PW_LOCK = threading.Lock()
_PW_STATE: dict[str, Any] = {"pid": None, "pw": None, "refs": 0, "tmp": None}
def _remove_tmp_root() -> None:
  root = _PW_STATE.get("tmp")
  if root and _PW_STATE["pid"] == os.getpid():
    shutil.rmtree(root, ignore_errors=True)
    _PW_STATE["tmp"] = None


atexit.register(_remove_tmp_root)


def _acquire_playwright():
  """The process's Playwright driver, started on first use (one node process serves all envs here), with its
  and its browsers' temporary files under this process's temp root."""
  with _PW_LOCK:
    if _PW_STATE["pid"] != os.getpid():  # a forked child must not reuse its parent's driver
      _PW_STATE.update(pid=os.getpid(), pw=None, refs=0, tmp=None)
    if _PW_STATE["pw"] is None:
      tempdirs.sweep_stale()
      _PW_STATE["tmp"] = tmp_root()
      previous = os.environ.get("TMPDIR")
      os.environ["TMPDIR"] = _PW_STATE["tmp"]  # the driver and the Chromium it starts inherit it
      try:
        _PW_STATE["pw"] = sync_playwright().start()
      finally:
        if previous is None:
          os.environ.pop("TMPDIR", None)
        else:
          os.environ["TMPDIR"] = previous
    _PW_STATE["refs"] += 1
    return _PW_STATE["pw"]


def tmp_root() -> str:
  """This process's browser temp root (created on first use; see `tempdirs`)."""
  root = _PW_STATE.get("tmp") if _PW_STATE["pid"] == os.getpid() else None
  if root is None or not os.path.isdir(root):
    root = tempdirs.make_root()
    _PW_STATE.update(pid=os.getpid(), tmp=root)
  return root


def _release_playwright() -> None:
  with _PW_LOCK:
    if _PW_STATE["pid"] != os.getpid() or _PW_STATE["pw"] is None:
      return
    _PW_STATE["refs"] -= 1
    if _PW_STATE["refs"] <= 0:
      try:
        _PW_STATE["pw"].stop()
      except Exception:  # the driver may already be gone at interpreter shutdown
        pass
      _PW_STATE.update(pw=None, refs=0)
      _remove_tmp_root()


def _top_level(request) -> bool:
  """Whether a navigation request loads a page's main document. A new window's first navigation is issued before
  its frame exists (Playwright raises on `request.frame`): a main document too."""
  try:
    return request.frame.parent_frame is None
  except PlaywrightError:
    return True


def _wait_exited(procs: list, timeout: float) -> list:
  """Waits until every process in `procs` has exited; returns those still running at `timeout`. A zombie has
  exited: Chromium's zygotes outlive the browser process, pass to PID 1 and wait there to be reaped (~1 s in a
  container whose init reaps slowly), holding nothing; `psutil.wait_procs` would wait for that too."""
  deadline = time.monotonic() + timeout
  while True:
    alive = []
    for p in procs:
      try:
        if p.status() != psutil.STATUS_ZOMBIE:
          alive.append(p)
      except psutil.NoSuchProcess:
        pass
    if not alive or time.monotonic() >= deadline:
      return alive
    time.sleep(0.02)


def chromium_executable(pw) -> str | None:
  """Playwright's own Chromium if installed (None = let Playwright use it), else Debian's."""
  try:
    if pathlib.Path(pw.chromium.executable_path).exists():
      return None
  except Exception:
    pass
  if pathlib.Path(DEBIAN_CHROMIUM).exists():
    return DEBIAN_CHROMIUM
  raise FileNotFoundError("No Chromium found: install Debian's `chromium` (apt-get install chromium) or run "
                          "`playwright install chromium`.")


def _browser_pids() -> set[int]:
  """Chromium browser processes (not renderers) started by this process's Playwright driver."""
  pids = set()
  for child in psutil.Process().children(recursive=True):
    try:
      if "--remote-debugging-pipe" in child.cmdline():
        pids.add(child.pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
      pass
  return pids


def blocked_message(blocked: list[str], origins: tuple[str, ...]) -> str:
  """The observation's error after navigations outside the task's origins ("" if none)."""
  if not blocked:
    return ""
  return f"Navigation to {blocked[-1]} was blocked: this task may only visit {', '.join(origins)}.\n"


def types_as_text(tag: str, type_attr: str | None) -> bool:
  """WebVoyager's text-box test for a typing target (its `type` attribute as written); else it warns."""
  return tag == "textarea" or (tag == "input" and type_attr in _TEXT_INPUT_TYPES)


def origin_of(url: str) -> str:
  p = urllib.parse.urlsplit(url)
  return f"{p.scheme}://{p.netloc}"


def default_origins(start_url: str) -> tuple[str, ...]:
  """A task's allowlist when it names none: its start page's origin (`file://` for a file, none for data:)."""
  scheme = urllib.parse.urlsplit(start_url).scheme.lower()
  if scheme == "file":
    return (egress.FILES,)
  return (origin_of(start_url),) if scheme in ("http", "https") else ()


def outside_origins_regex(origins: tuple[str, ...]) -> re.Pattern:
  """A regex (JS-compatible) matching at least every URL outside `origins`, so the driver routes only those to
  Python, where `egress.allowed` decides exactly (a `*` never spans `@`, `:` or `/`: no userinfo tricks)."""
  alternatives = "|".join(re.escape(o).replace(r"\*", "[A-Za-z0-9.-]*") for o in origins)
  return re.compile(rf"^(?!(?:data|blob|about):)(?!(?:{alternatives})(?:[/?#]|$))")


class BrowserEnv:
  """A Playwright Chromium behind the `jaxagent.types.Env` protocol.

  Args (plain values, so a pool can build one from a picklable spec):
    profile: "web" | "device" | "text" (`jaxagent.envs.profiles`) or a `Profile`; None = each task's own
      `Task.profile` (the context is new every episode, so one env serves web and device tasks alike).
    observation: whose element numbering actions refer to: "som" | "a11y" | "html"; or "screenshot": the screen
      alone, no elements and no element pass (agents that act at screen points, as AitW's).
    screenshot_size: (width, height) to resize screenshots to; None = one pixel per CSS pixel.
    som_draw: draw the set-of-marks boxes on the screenshot (WebVoyager's GPT-4o agent sees them).
    load_timeout_ms / idle_timeout_ms: caps on waiting for `load` and `networkidle` after a navigation
      (`networkidle` needs 500 ms of quiet, so it is off by default; turn it on for live sites).
    action_timeout_ms: Playwright's timeout for one action.
    wait_ms: how long a `wait` action waits.
    a11y_keep_unnamed: roles the accessibility tree keeps without a name (default: none, as OpenWebVoyager).
    executable_path: a Chromium binary; None = Playwright's own, else Debian's.
    fresh_context: open a new browser context every episode; False (the default) keeps the context and starts
      each episode in a new tab of it with cookies and every origin's storage cleared (`_reuse_context`), which
      is ~4x cheaper; a task with another profile or other origins, or a crashed page, still gets a new one.
  """

  def __init__(self, profile: str | profiles_lib.Profile | None = None, observation: str = "som",
               screenshot_size: tuple[int, int] | None = None, som_draw: bool = True, headless: bool = True,
               load_timeout_ms: int = 5000, idle_timeout_ms: int = 0, action_timeout_ms: int = 5000,
               wait_ms: int = 1000, a11y_keep_unnamed: tuple[str, ...] = (), executable_path: str | None = None,
               fresh_context: bool = False):
    if observation not in OBSERVATIONS:
      raise ValueError(f"observation={observation!r} is not an observer; use one of {OBSERVATIONS}")
    self._fixed_profile = profiles_lib.get_profile(profile) if profile is not None else None
    self.profile = self._fixed_profile or profiles_lib.PROFILES["web"]
    self.observation = observation
    self.screenshot_size = tuple(screenshot_size) if screenshot_size else None
    self.som_draw = som_draw
    self.headless = headless
    self.load_timeout_ms = load_timeout_ms
    self.idle_timeout_ms = idle_timeout_ms
    self.action_timeout_ms = action_timeout_ms
    self.wait_ms = wait_ms
    self.a11y_keep_unnamed = tuple(a11y_keep_unnamed)
    self.executable_path = executable_path
    self.fresh_context = fresh_context
    self.downloads_dir: pathlib.Path | None = None  # made under the process's temp root at launch
    self._pw = None
    self._browser = None
    self._browser_pid: int | None = None
    self._disconnected = False
    self._page_crashed = False
    self._context = None
    self._page = None
    self._cdp: dict[int, Any] = {}
    self._task: Task | None = None
    self._origins: tuple[str, ...] = ()
    self._targets: dict[int, Element] = {}
    self._nav_requests = self._commits = self._nav_failed = 0
    self._blocked: list[str] = []
    self._proxy: egress.EgressProxy | None = None
    self._last_allowed_url = ""
    self._new_pages: list[Any] = []
    self._pending_downloads: list[Any] = []
    self._downloads: list[str] = []
    self._steps = 0
    self._warning = ""
    self._done = True

  # ------------------------------------------------------------------------------------------ lifecycle

  @property
  def browser_pid(self) -> int | None:
    """The Chromium browser process id (for crash tests and the pool's watchdog)."""
    return self._browser_pid

  @property
  def page(self):
    """The active Playwright page (for judges reading final page state and for tests)."""
    return self._page

  def launch(self) -> None:
    """Starts Chromium (done lazily by `reset`); relaunches it if it died."""
    if self._browser is not None and self.alive():
      return
    self._shutdown_browser()
    if self._pw is None:
      self._pw = _acquire_playwright()
    if self.downloads_dir is None or not self.downloads_dir.is_dir():
      self.downloads_dir = pathlib.Path(tempfile.mkdtemp(prefix="downloads-", dir=tmp_root()))
    before = _browser_pids()
    args = [f for f in CHROMIUM_FLAGS if self.headless or f != "--headless"]
    self._browser = self._pw.chromium.launch(
        # a browser needs no API key; its temporary files (the singleton socket's directory) go in the root
        headless=self.headless, args=args, env={**secrets.scrubbed_environ(), "TMPDIR": tmp_root()},
        executable_path=self.executable_path or chromium_executable(self._pw))
    self._disconnected = False
    browser = self._browser  # a late event from a browser already replaced must not mark the new one
    browser.on("disconnected", lambda _: self._browser is browser and setattr(self, "_disconnected", True))
    new = _browser_pids() - before
    self._browser_pid = min(new) if new else None

  def alive(self) -> bool:
    if self._browser is None or self._disconnected or not self._browser.is_connected():
      return False
    if self._browser_pid is None:
      return True
    try:
      return psutil.Process(self._browser_pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
      return False

  def _crash_reason(self) -> str:
    """Why the episode cannot go on ("" if it can): the browser process or the page's renderer died."""
    if not self.alive():
      return f"Chromium (pid {self._browser_pid}) died"
    if self._page_crashed:
      return "the page's renderer crashed"
    return ""

  def close(self) -> None:
    """Closes the browser and waits until no Chromium process of this env is left."""
    self._shutdown_browser()
    if self._pw is not None:
      self._pw = None
      _release_playwright()
    if self._proxy is not None:
      self._proxy.close()
      self._proxy = None
    if self.downloads_dir is not None:
      shutil.rmtree(self.downloads_dir, ignore_errors=True)
      self.downloads_dir = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def _shutdown_browser(self) -> None:
    pid = self._browser_pid
    procs = []
    if pid is not None:
      try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
      except psutil.NoSuchProcess:
        pass
    if self._browser is not None:
      try:
        self._browser.close()
      except Exception:  # already dead or disconnected
        pass
    alive = _wait_exited(procs, timeout=5)
    for p in alive:  # a browser that ignored close: make sure nothing is left behind
      try:
        p.kill()
      except psutil.NoSuchProcess:
        pass
    _wait_exited(alive, timeout=5)
    self._browser = self._context = self._page = None
    self._browser_pid = None
    self._cdp = {}

  # -------------------------------------------------------------------------------------------- episode

  def reset(self, task: Task) -> Observation:
    """Starts `task` in a clean tab (`_begin`); relaunches a dead browser first."""
    self._check_task(task)
    for attempt in range(2):
      try:
        self.launch()
        self._begin(task)
        break
      except PlaywrightError as e:
        if self.alive():
          raise RuntimeError(f"Task {task.id!r}: could not open {task.start_url}: {str(e).splitlines()[0]}") from e
        if attempt == 1:
          raise BrowserCrashed(f"Chromium died twice while starting task {task.id!r}: {e}") from e
        log.warning("Chromium died during reset; relaunching")
    self._task = task
    self._steps = 0
    self._done = False
    self._leave_forbidden_page()
    obs = self._observe_settled()
    obs.error = self._blocked_message()
    return obs

  def step(self, action: Action) -> tuple[Observation, float, bool, dict[str, Any]]:
    if self._task is None:
      raise RuntimeError("BrowserEnv.step called before reset(task)")
    if self._done:
      raise RuntimeError("BrowserEnv.step called after the episode ended; call reset(task)")
    if self._crash_reason():
      raise BrowserCrashed(f"{self._crash_reason()}; reset() recovers")
    self._steps += 1
    self._blocked.clear()
    self._warning = ""
    error, detail, answer = "", "", None
    try:
      if action.kind == ActionKind.INVALID:
        error = action.reason or FAIL_OBS
      elif action.ends_episode:
        answer = action.text
      else:
        self._execute(action)
        self._settle()
        if action.kind in (ActionKind.TYPE, ActionKind.KEY):
          self._scroll_still()  # a space or an arrow key outside a text box scrolls the page, smoothly
    except ActionFailed as e:
      error, detail = str(e), str(e)
    except PlaywrightError as e:
      if self._crash_reason():
        raise BrowserCrashed(f"{self._crash_reason()} during {action.kind.value}: {e}") from e
      error, detail = FAIL_OBS, str(e).splitlines()[0]
    try:
      self._leave_forbidden_page()
      self._collect_downloads()
      reward, env_done, extra = self._reward_done()
      done = action.ends_episode or env_done
      truncated = not done and self._steps >= self._task.max_steps
      obs = self._observe_settled()
    except PlaywrightError as e:
      if self._crash_reason():
        raise BrowserCrashed(f"{self._crash_reason()} while observing: {e}") from e
      raise
    error = error or self._blocked_message()
    obs.error = error
    if self._warning:
      obs.extra["warning"] = self._warning
    self._done = done or truncated
    info = {"url": obs.url, "error": error, "error_detail": detail, "answer": answer, "steps": self._steps,
            "truncated": truncated, "downloads": list(self._downloads), "blocked": list(self._blocked),
            "refused": self._proxy.take_refused() if self._proxy is not None else [],
            "warning": self._warning, **extra}
    return obs, reward, self._done, info

  # ----------------------------------------------------------------------- hooks for subclasses (MiniWoB)

  def _check_task(self, task: Task) -> None:
    if not task.start_url:
      raise ValueError(f"Task {task.id!r}: start_url is empty; give the page the episode starts on")

  def _begin(self, task: Task) -> None:
    """Opens the task's start page in a clean tab: of a new context, or of this one emptied (`fresh_context`)."""
    if self._can_reuse_context(task):
      self._reuse_context(task)
    else:
      self._new_context(task)
    self._goto(task.start_url)

  def _intent(self) -> str:
    return self._task.intent

  def _reward_done(self) -> tuple[float, bool, dict[str, Any]]:
    """Web tasks are scored later by judges: reward 0, never done by the page itself."""
    return 0.0, False, {}

  # --------------------------------------------------------------------------------------- page plumbing

  def _new_context(self, task: Task) -> None:
    if self._context is not None:
      try:
        self._context.close()
      except PlaywrightError:
        pass
    self._reset_episode_state()
    self._origins = tuple(task.allowed_origins) or default_origins(task.start_url)
    if self._proxy is None:
      self._proxy = egress.EgressProxy()
    self._proxy.set_origins(self._origins)
    self._proxy.take_refused()
    self.profile = self._fixed_profile or profiles_lib.get_profile(task.profile)
    # Every request, loopback included, goes through the egress proxy (Chromium bypasses loopback by default).
    self._context = self._browser.new_context(accept_downloads=True, proxy={"server": self._proxy.url,
                                                                            "bypass": "<-loopback>"},
                                              **self.profile.context_options())
    self._context.set_default_timeout(self.action_timeout_ms)
    self._context.add_init_script(_NAV_SPY_JS)
    # Only requests outside the allowed origins are intercepted (the driver matches the regex), so pages on
    # allowed origins load without a round trip to Python per request.
    self._context.route(outside_origins_regex(self._origins), self._route)
    self._context.on("page", lambda page: self._new_pages.append(page))
    self._page = self._context.new_page()
    self._new_pages.clear()
    self._adopt(self._page)

  def _can_reuse_context(self, task: Task) -> bool:
    origins = tuple(task.allowed_origins) or default_origins(task.start_url)
    profile = self._fixed_profile or profiles_lib.get_profile(task.profile)
    return (not self.fresh_context and self._context is not None and not self._page_crashed
            and origins == self._origins and profile == self.profile
            and not any("*" in o for o in origins))  # a wildcard origin has no single storage to clear

  def _reset_episode_state(self) -> None:
    self._cdp = {}
    self._targets = {}
    self._page_crashed = False
    self._blocked, self._new_pages, self._pending_downloads, self._downloads = [], [], [], []
    self._last_allowed_url = ""
    if self._proxy is not None:
      self._proxy.take_refused()

  def _reuse_context(self, task: Task) -> None:
    """Empties this context for a new episode, as a new context would be: every tab closed (back-history,
    session storage, pop-up windows and page scripts go with them), cookies cleared, and local storage,
    IndexedDB, cache storage and service workers of every allowed origin cleared; then one new tab."""
    old_pages = list(self._context.pages)
    self._page = self._context.new_page()
    cdp = self._context.new_cdp_session(self._page)
    for page in old_pages:
      page.close()
    self._context.clear_cookies()
    for origin in self._origins:
      cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
    cdp.detach()
    self._reset_episode_state()
    self._adopt(self._page)

  def _adopt(self, page) -> None:
    page.on("request", self._on_request)
    page.on("requestfailed", self._on_request_failed)
    page.on("framenavigated", self._on_frame_navigated)
    page.on("download", lambda download: self._pending_downloads.append(download))
    page.on("dialog", lambda dialog: dialog.accept())
    page.on("crash", lambda _: page is self._page and setattr(self, "_page_crashed", True))

  def _on_request(self, request) -> None:
    if request.is_navigation_request() and request.frame.parent_frame is None:
      self._nav_requests += 1
      if not self._allowed(request.url) and request.url not in self._blocked:
        self._blocked.append(request.url)  # a redirect hop the proxy will refuse, or one the route blocks

  def _on_request_failed(self, request) -> None:
    if request.is_navigation_request() and _top_level(request):
      self._nav_failed += 1

  def _on_frame_navigated(self, frame) -> None:
    if frame.parent_frame is None:
      self._commits += 1

  def _allowed(self, url: str) -> bool:
    return egress.allowed(url, self._origins)

  def _route(self, route, request) -> None:
    if self._allowed(request.url):
      route.continue_()
    elif request.is_navigation_request():
      if _top_level(request) and request.url not in self._blocked:
        self._blocked.append(request.url)
      route.fulfill(status=204)  # 204 cancels the navigation: the page stays where it was
    else:
      route.abort("blockedbyclient")

  def _leave_forbidden_page(self) -> None:
    """A main-frame document outside the allowlist (an error page of a refused connection, or any way the
    checks above missed) is reported and replaced by the last allowed page (else the start page)."""
    url = self._page.url
    if self._allowed(url):
      if not url.startswith(egress.LOCAL_SCHEMES):
        self._last_allowed_url = url
      return
    if url not in self._blocked:
      self._blocked.append(url)
    self._goto(self._last_allowed_url or self._task.start_url)

  def _blocked_message(self) -> str:
    return blocked_message(self._blocked, self._origins)

  def _goto(self, url: str) -> None:
    blocked = len(self._blocked)
    try:
      self._page.goto(url, wait_until="load", timeout=self.load_timeout_ms)
    except PlaywrightTimeoutError:
      pass  # a slow page is observed as it is
    except PlaywrightError:
      if len(self._blocked) > blocked:
        return  # the URL or one of its redirects was blocked: reported through the observation's error
      raise
    self._wait_idle()

  def _wait_idle(self) -> None:
    if self.idle_timeout_ms <= 0:
      return
    try:
      self._page.wait_for_load_state("networkidle", timeout=self.idle_timeout_ms)
    except PlaywrightTimeoutError:
      pass

  def _settle(self) -> None:
    """Lets queued handlers run; if that started a navigation, waits (capped) until it commits and loads,
    or is blocked / failed / turned into a download."""
    before = (self._nav_requests, self._commits, len(self._blocked), len(self._pending_downloads), self._nav_failed)
    try:
      navs, popups = self._page.evaluate(_SETTLE_JS)
      pending = navs > 0
    except PlaywrightError:
      if not self.alive():
        raise
      pending, popups = True, 0  # the document went away under us: a navigation
    deadline = time.monotonic() + self.load_timeout_ms / 1000
    while popups and not self._new_pages and time.monotonic() < deadline:
      self._page.wait_for_timeout(20)  # the page asked for a window; Playwright reports it shortly
    if self._switch_pages():  # a popup loads its first document; Playwright waits for it correctly
      try:
        self._page.wait_for_load_state("load", timeout=max(1, (deadline - time.monotonic()) * 1000))
      except PlaywrightTimeoutError:
        pass
      return
    if not pending and self._nav_requests == before[0] and self._commits == before[1]:
      return
    while time.monotonic() < deadline:
      if self._commits > before[1]:
        try:
          self._page.wait_for_load_state("load", timeout=max(1, (deadline - time.monotonic()) * 1000))
        except PlaywrightTimeoutError:
          pass
        break
      if (len(self._blocked) > before[2] or len(self._pending_downloads) > before[3]
          or self._nav_failed > before[4]):
        break
      self._page.wait_for_timeout(20)
    self._wait_idle()

  def _scroll_still(self) -> None:
    try:
      self._page.evaluate(_SCROLL_STILL_JS)
    except PlaywrightError:
      if not self.alive():
        raise  # else the document is being replaced: there is nothing left to scroll

  def _switch_pages(self) -> bool:
    """Makes a newly opened page (or, if the active one closed, the last open one) active; True if it changed."""
    switched = False
    if self._new_pages:
      page = self._new_pages[-1]
      self._new_pages.clear()
      self._adopt(page)
      self._page = page
      switched = True
    if self._page.is_closed():
      open_pages = [p for p in self._context.pages if not p.is_closed()]
      self._page = open_pages[-1] if open_pages else self._context.new_page()
      self._new_pages.clear()
      switched = True
    return switched

  def _collect_downloads(self) -> None:
    while self._pending_downloads:
      download = self._pending_downloads.pop(0)
      path = self.downloads_dir / f"{len(self._downloads)}_{download.suggested_filename}"
      try:
        download.save_as(path)
        self._downloads.append(str(path))
      except PlaywrightError as e:
        log.warning("download of %s failed: %s", download.url, e)

  def _cdp_session(self):
    key = id(self._page)
    if key not in self._cdp:
      self._cdp[key] = self._context.new_cdp_session(self._page)
    return self._cdp[key]

  # ----------------------------------------------------------------------------------------- observing

  def _observe_settled(self) -> Observation:
    """Observes; if the document is replaced mid-observation (a late navigation), waits for it and retries."""
    try:
      return self._observe()
    except PlaywrightError:
      if not self.alive():
        raise
      try:
        self._page.wait_for_load_state("load", timeout=self.load_timeout_ms)
      except PlaywrightTimeoutError:
        pass
      return self._observe()

  def _observe(self) -> Observation:
    page = self._page
    obs = Observation(url=page.url, title=page.title(), intent=self._intent(), step=self._steps,
                      viewport=(self.profile.width, self.profile.height))
    shoot = self.profile.screenshot
    if self.observation == "som":
      records = som_obs.mark(page, draw=self.som_draw and shoot)
      try:
        if shoot:
          obs.screenshot = screenshot_obs.capture(page, self.screenshot_size)
      finally:
        if self.som_draw and shoot:
          som_obs.clear(page)
      obs.elements = som_obs.to_elements(records)
      obs.element_text = som_obs.format_element_text(records)
    else:
      if self.observation == "a11y":
        obs.a11y_tree, obs.a11y_nodes = a11y_obs.observe(page, self._cdp_session(), self.a11y_keep_unnamed)
        obs.elements = [Element(index=i, tag=n["role"], text=n["name"], bbox=tuple(n["union_bound"]), role=n["role"])
                        for i, n in obs.a11y_nodes.items()]
      elif self.observation == "html":
        obs.html, obs.elements = html_obs.simplify(page)
      if shoot:
        obs.screenshot = screenshot_obs.capture(page, self.screenshot_size)
    if self._downloads:
      obs.extra["downloads"] = list(self._downloads)
    self._targets = {e.index: e for e in obs.elements}
    return obs

  # ------------------------------------------------------------------------------------------ executing

  def _element_point(self, index: int) -> tuple[float, float]:
    if self.observation == "html":
      bbox = html_obs.live_bbox(self._page, index)
    else:
      element = self._targets.get(index)
      bbox = element.bbox if element is not None else None
    if bbox is None:
      raise ActionFailed()
    x, y, w, h = bbox
    return x + w / 2, y + h / 2

  def _screen_to_page(self, x: float, y: float) -> tuple[float, float]:
    """A point on the screen (CSS px of the screenshot) -> input-event coordinates (layout viewport px)."""
    if not self.profile.is_mobile:  # desktop pages are never zoomed: the two coincide
      return x, y
    scale, left, top = self._page.evaluate(
        "() => { const v = window.visualViewport; return v ? [v.scale, v.offsetLeft, v.offsetTop] : [1, 0, 0]; }")
    return x / scale + left, y / scale + top

  def _point(self, action: Action, required: bool = True) -> tuple[float, float] | None:
    if action.element is not None:
      return self._element_point(action.element)
    if action.x is not None and action.y is not None:
      if action.normalized:
        return self._screen_to_page(action.x * self.profile.width, action.y * self.profile.height)
      return float(action.x), float(action.y)
    if required:
      raise ActionFailed()
    return None

  def _tap_or_click(self, x: float, y: float) -> None:
    if self.profile.has_touch:
      self._page.touchscreen.tap(x, y)
    else:
      self._page.mouse.click(x, y)

  def _execute(self, action: Action) -> None:
    page, kind = self._page, action.kind
    if kind == ActionKind.CLICK:
      self._tap_or_click(*self._point(action))
    elif kind == ActionKind.TYPE:
      point = self._point(action, required=False)
      if point is not None:
        tag, typ = page.evaluate(
            "([x, y]) => { const el = document.elementFromPoint(x, y);"
            " return el ? [el.tagName.toLowerCase(), el.getAttribute('type')] : ['', null]; }", list(point))
        textbox = types_as_text(tag, typ)
        if not textbox:
          self._warning = TYPE_WARNING.format(tag=tag, type=typ)
        self._tap_or_click(*point)
        if not textbox:  # a click that submits or follows a link: the keys go to the page it opens, not a race
          self._settle()
        page.keyboard.press("Control+A")
        page.keyboard.press("Backspace")
      page.keyboard.type(action.text)
      if action.enter:
        page.keyboard.press("Enter")
    elif kind == ActionKind.SCROLL:
      self._scroll(action)
    elif kind == ActionKind.SWIPE:
      self._swipe(action)
    elif kind == ActionKind.SELECT:
      x, y = self._point(action)
      if not page.evaluate(_SELECT_JS, {"x": x, "y": y, "text": action.text}):
        raise ActionFailed()
    elif kind == ActionKind.HOVER:
      page.mouse.move(*self._point(action))
    elif kind == ActionKind.KEY:
      if not action.key:
        raise ActionFailed()
      page.keyboard.press(_KEY_NAMES.get(action.key.lower(), action.key))
    elif kind == ActionKind.BACK:
      page.go_back(wait_until="load", timeout=self.load_timeout_ms)
      if page.url == "about:blank":  # never back past the start page onto the new tab's blank page
        page.go_forward(wait_until="load", timeout=self.load_timeout_ms)
    elif kind == ActionKind.FORWARD:
      page.go_forward(wait_until="load", timeout=self.load_timeout_ms)
    elif kind == ActionKind.HOME:
      self._goto(self._task.meta.get("home_url") or self._task.start_url)
    elif kind == ActionKind.RESTART:
      self._goto(self._task.start_url)
    elif kind == ActionKind.GOTO:
      if not action.url:
        raise ActionFailed()
      if not self._allowed(action.url):  # route interception does not see every scheme (file:, chrome:)
        self._blocked.append(action.url)
        return
      self._goto(action.url)
    elif kind == ActionKind.WAIT:
      page.wait_for_timeout(self.wait_ms)
    elif kind == ActionKind.NOOP:
      pass
    else:
      raise ActionFailed()

  def _scroll(self, action: Action) -> None:
    """WebVoyager's scroll: 2/3 of the viewport; an element target scrolls what is under its centre."""
    direction = action.direction.lower() or "down"
    if direction not in ("up", "down", "left", "right"):
      raise ActionFailed()
    width, height = self._page.evaluate("[window.innerWidth, window.innerHeight]")
    dx = {"left": -1, "right": 1}.get(direction, 0) * width * 2 / 3
    dy = {"up": -1, "down": 1}.get(direction, 0) * height * 2 / 3
    point = self._point(action, required=False)
    if point is None:
      self._page.evaluate("([dx, dy]) => window.scrollBy(dx, dy)", [dx, dy])
    else:
      self._page.mouse.move(*point)
      self._page.mouse.wheel(dx, dy)
    self._page.evaluate(_SCROLL_STILL_JS)

  def _swipe(self, action: Action) -> None:
    """A touch drag from (x, y) to (x2, y2); shorter than ~3 px it is a tap (DigiRL: dist² < 10 px², §4.3)."""
    start = self._point(action)
    if action.x2 is None or action.y2 is None:
      raise ActionFailed()
    if action.normalized:
      end = self._screen_to_page(action.x2 * self.profile.width, action.y2 * self.profile.height)
    else:
      end = (float(action.x2), float(action.y2))
    if (end[0] - start[0]) ** 2 + (end[1] - start[1]) ** 2 < 10:
      self._tap_or_click(*start)
      return
    steps = 8
    path = [(start[0] + (end[0] - start[0]) * i / steps, start[1] + (end[1] - start[1]) * i / steps)
            for i in range(steps + 1)]
    if self.profile.has_touch:
      # The events carry their own times, SWIPE_SECONDS apart end to end: the fling's velocity, and so where the
      # page comes to rest, is then the drag's alone, not how busy the machine was when they were sent.
      cdp, t0 = self._cdp_session(), time.time()
      at = lambda i: t0 + SWIPE_SECONDS * i / steps
      cdp.send("Input.dispatchTouchEvent",
               {"type": "touchStart", "touchPoints": [{"x": path[0][0], "y": path[0][1]}], "timestamp": at(0)})
      for i, (x, y) in enumerate(path[1:], 1):
        cdp.send("Input.dispatchTouchEvent",
                 {"type": "touchMove", "touchPoints": [{"x": x, "y": y}], "timestamp": at(i)})
      cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": [], "timestamp": at(steps)})
    else:
      mouse = self._page.mouse
      mouse.move(*path[0])
      mouse.down()
      for x, y in path[1:]:
        mouse.move(x, y)
      mouse.up()
    self._page.evaluate(_SCROLL_STILL_JS)


# WebRL's select: the <select> at the point, first option whose text contains the argument (case-insensitive).
_SELECT_JS = """({x, y, text}) => {
  const el = document.elementFromPoint(x, y);
  const select = el && (el.tagName === 'SELECT' ? el : el.closest('select') || el.querySelector('select'));
  if (!select) return false;
  const want = text.toLowerCase();
  const option = [...select.options].find((o) => o.text.toLowerCase().includes(want));
  if (!option) return false;
  select.value = option.value;
  select.dispatchEvent(new Event('input', {bubbles: true}));
  select.dispatchEvent(new Event('change', {bubbles: true}));
  return true;
}"""
