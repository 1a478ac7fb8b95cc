"""MiniWoB++ (the `miniwob` pip package's HTML tasks) on `BrowserEnv`: a real benchmark nobody here wrote.

Every task the package ships is a task suite (`task_names()`): the `html/miniwob/*.html` pages and the
FlightWoB wrappers (`flight.<Site>`). The package's HTML is served by a tiny threaded HTTP server on 127.0.0.1,
started once per process. An episode is driven by the page's own JavaScript, as `miniwob`'s
`SeleniumInstance` does: `Math.seedrandom(seed)`, `core.setDataMode(mode)`, `core.startEpisodeReal()`, then
wait for `WOB_TASK_READY`; reward and done are read from `WOB_RAW_REWARD_GLOBAL` / `WOB_REWARD_GLOBAL` and
`WOB_DONE_GLOBAL`; the utterance (`core.getUtterance()`) is the observation's intent.

The viewport is the task area itself (160x210 CSS px; 375x667 for FlightWoB), so screenshots and set-of-marks
show only the task (the reward panel beside it is hidden). Observers and actions are the web profile's
(`observation="som"|"a11y"|"html"`); with "a11y", consider `a11y_keep_unnamed=("textbox",)`: MiniWoB's inputs
have no labels, and OpenWebVoyager's tree drops unnamed nodes.

Rewards: `reward="raw"` (default) gives the task's reward without MiniWoB's time discount, so success is 1.0;
`reward="time_scaled"` gives the package's default (`WOB_REWARD_GLOBAL`). Both are in `info`.

The clock: each page ends its episode with −1 ("timed out") after its own `core.EPISODE_MAX_TIME` (7-30 s of wall
time), which makes a reward depend on how fast the machine and the model are (a compile, a loaded CPU, a bigger
model). By default (`episode_max_time_ms=0`) that timer is pushed out of reach, so only the rollout's step limit
ends an episode that the page does not end itself; `episode_max_time_ms=None` keeps the page's own limit (the
`miniwob` package's behaviour, and what `reward="time_scaled"` discounts by), a positive value sets one.

Episodes: by default the page is loaded once per task name and each `reset` restarts the episode in place
(MiniWoB's own design) and reloaded in a fresh context every `reload_every` episodes (like the package's
`refresh_freq`, against slow leaks); `fresh_context=True` opens a fresh context and reloads every episode.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import pathlib
import threading
import time
from typing import Any, Iterable

from jaxagent.envs.browser import BrowserEnv
from jaxagent.envs.profiles import Profile
from jaxagent.types import Task

MINIWOB_PROFILE = Profile("miniwob", 160, 210)
FLIGHT_PROFILE = Profile("miniwob-flight", 375, 667)
_READY_TIMEOUT_S = 2.0

# --------------------------------------------------------------------------------- local HTTP server

_SERVERS: dict[str, http.server.ThreadingHTTPServer] = {}
_SERVERS_LOCK = threading.Lock()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  # MiniWoB's pages are UTF-8 without a <meta charset>; undeclared, Chromium reads them as Windows-1252 and
  # unicode-test's "ÖK" button (and its utterance) turn into "Ã–K".
  extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                    ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                    ".css": "text/css; charset=utf-8"}

  def log_message(self, *args) -> None:
    pass


def serve_directory(directory: str | pathlib.Path) -> str:
  """Serves `directory` over HTTP on 127.0.0.1 (once per process and directory); returns its base URL."""
  directory = str(pathlib.Path(directory).resolve())
  with _SERVERS_LOCK:
    server = _SERVERS.get(directory)
    if server is None:
      handler = functools.partial(_QuietHandler, directory=directory)
      server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
      server.daemon_threads = True
      threading.Thread(target=server.serve_forever, name=f"http:{directory}", daemon=True).start()
      _SERVERS[directory] = server
  host, port = server.server_address[:2]
  return f"http://{host}:{port}/"


def html_dir() -> pathlib.Path:
  import miniwob  # pylint: disable=g-import-not-at-top

  return pathlib.Path(miniwob.__file__).resolve().parent / "html"


def base_url() -> str:
  return serve_directory(html_dir())


# ------------------------------------------------------------------------------------------ task suite


def task_names() -> list[str]:
  """Every task the package ships: `html/miniwob/<name>.html` and `flight.<Site>` (FlightWoB)."""
  root = html_dir()
  names = sorted(p.stem for p in (root / "miniwob").glob("*.html"))
  names += sorted(f"flight.{p.parent.name}" for p in (root / "flight").glob("*/wrapper.html"))
  return names


def task_path(name: str) -> str:
  if name.startswith("flight."):
    return f"flight/{name.split('.', 1)[1]}/wrapper.html"
  return f"miniwob/{name}.html"


def make_task(name: str, seed: int = 0, max_steps: int = 10, split: str = "train") -> Task:
  """One seeded MiniWoB episode. The intent is filled in from the page's utterance at reset."""
  if name not in task_names():
    raise ValueError(f"MiniWoB task {name!r} does not exist; see jaxagent.envs.miniwob.task_names()")
  return Task(id=f"miniwob/{name}/{seed}", intent="", site="miniwob", start_url=base_url() + task_path(name),
              profile="miniwob", max_steps=max_steps, split=split, template=name, seed=seed,
              meta={"miniwob_task": name})


def suite(names: Iterable[str] | None = None, seeds: Iterable[int] = range(10), max_steps: int = 10,
          split: str = "train") -> list[Task]:
  """Tasks for `names` (default: all) x `seeds`."""
  names = task_names() if names is None else list(names)
  return [make_task(n, s, max_steps, split) for n in names for s in seeds]


# ------------------------------------------------------------------------------------------ training suite

# The tasks an RL recipe trains and evaluates on: each has a scripted solver (`miniwob_solvers`) that succeeds on
# >= 95 % of 50 train and of 50 test seeds within 6 steps, and a WebRL prompt (`get_format("webrl")`, any step)
# of at most 2,000 characters (1,879 the longest). Measured in docs/results/miniwob.md
# (`python data_tools/miniwob_expert.py`). Beside each: how many distinct utterances 50 test seeds give, the
# number of intents a held-out success rate really averages over, and distinct pages (the HTML without its
# layout): a task with one utterance and one page (click-test, focus-text) is the same instance in every seed.
TRAINING_TASKS: tuple[str, ...] = (
    "choose-list",                  # utterances 47, pages 50
    "click-button",                 # utterances 15, pages 50
    "click-collapsible",            # utterances  1, pages 32
    "click-collapsible-2-nodelay",  # utterances 49, pages 49
    "click-collapsible-nodelay",    # utterances  1, pages 32
    "click-dialog",                 # utterances  1, pages 50
    "click-dialog-2",               # utterances  3, pages 50
    "click-link",                   # utterances 46, pages 50
    "click-option",                 # utterances 50, pages 50
    "click-tab",                    # utterances  3, pages 50
    "click-tab-2",                  # utterances 49, pages 50
    "click-tab-2-easy",             # utterances 46, pages 50
    "click-tab-2-medium",           # utterances 48, pages 50
    "click-test",                   # utterances  1, pages  1
    "click-widget",                 # utterances  5, pages 50
    "copy-paste",                   # utterances  1, pages 50
    "copy-paste-2",                 # utterances  3, pages 50
    "enter-password",               # utterances 50, pages 50
    "enter-text",                   # utterances 30, pages 30
    "enter-text-2",                 # utterances 40, pages 40
    "enter-text-dynamic",           # utterances 50, pages 50
    "enter-time",                   # utterances 49, pages 49
    "find-greatest",                # utterances  1, pages 50
    "find-word",                    # utterances 13, pages 50
    "focus-text",                   # utterances  1, pages  1
    "focus-text-2",                 # utterances  3, pages  3
    "form-sequence-2",              # utterances 49, pages 49
    "identify-shape",               # utterances  1, pages 23
    "login-user",                   # utterances 50, pages 50
    "login-user-popup",             # utterances 50, pages 50
    "multi-layouts",                # utterances 50, pages 50
    "multi-orderings",              # utterances 50, pages 50
    "odd-or-even",                  # utterances  1, pages 50
    "read-table",                   # utterances  8, pages 50
    "read-table-2",                 # utterances  1, pages 50
    "simple-algebra",               # utterances  1, pages 50
    "simple-arithmetic",            # utterances  1, pages 50
    "text-transform",               # utterances  1, pages 50
    "unicode-test",                 # utterances  6, pages 50
    "use-autocomplete-nodelay",     # utterances 49, pages 50
)

# The held-out headline's tasks: those of TRAINING_TASKS whose 50 test seeds give at least 40 distinct instances
# (utterances or pages above), so a success rate over their test seeds averages over distinct intents rather than
# repeats of a few; chosen from the solvers' table, before any policy was trained on the suite.
HEADLINE_TASKS: tuple[str, ...] = tuple(t for t in TRAINING_TASKS if t not in (
    "click-collapsible", "click-collapsible-nodelay", "click-test", "enter-text", "focus-text", "focus-text-2",
    "identify-shape"))

TEST_SEED_BASE = 1_000_000
# The longest delay `setTimeout` keeps (~24.8 days; a longer one overflows and fires at once): "no clock".
NO_CLOCK_MS = 2**31 - 1


def split_seeds(split: str, n: int) -> range:
  """`n` episode seeds of a split: train counts up from 0, test from 1,000,000, so the two never share a seed."""
  if n < 0 or n > TEST_SEED_BASE:
    raise ValueError(f"n={n}: a split holds between 0 and {TEST_SEED_BASE} seeds")
  if split == "train":
    return range(n)
  if split == "test":
    return range(TEST_SEED_BASE, TEST_SEED_BASE + n)
  raise ValueError(f"split={split!r}; use 'train' or 'test'")


def training_suite(split: str, seeds_per_task: int, names: Iterable[str] = TRAINING_TASKS,
                   max_steps: int = 6) -> list[Task]:
  """`seeds_per_task` seeded episodes of each task in `names` from the split's seeds (`split_seeds`).

  Run them in `MiniWoBEnv(observation="html")` (WebRL's ids); the step limit `max_steps`, not the page's clock,
  ends an episode the page does not end (`MiniWoBEnv.episode_max_time_ms`)."""
  return suite(names, seeds=split_seeds(split, seeds_per_task), max_steps=max_steps, split=split)


# ------------------------------------------------------------------------------------------------- env


class MiniWoBEnv(BrowserEnv):
  """`BrowserEnv` on MiniWoB++ pages; reward and done come from the page's JavaScript.

  `episode_max_time_ms`: 0 (default) no wall-clock limit, the step limit ends an episode; None the page's own
  (`core.EPISODE_MAX_TIME`); > 0 that many ms (module docstring, "The clock")."""

  def __init__(self, observation: str = "som", reward: str = "raw", fresh_context: bool = False,
               reload_every: int = 200, data_mode: str = "train", episode_max_time_ms: int | None = 0,
               **kwargs: Any):
    if reward not in ("raw", "time_scaled"):
      raise ValueError(f"reward={reward!r}; use 'raw' (success = 1.0) or 'time_scaled' (MiniWoB's default)")
    if episode_max_time_ms is not None and (isinstance(episode_max_time_ms, bool) or
                                            not 0 <= int(episode_max_time_ms) <= NO_CLOCK_MS):
      raise ValueError(f"episode_max_time_ms={episode_max_time_ms!r}: 0 (no clock), None (the page's own) or a "
                       f"limit in ms up to {NO_CLOCK_MS}")
    if reward == "time_scaled" and episode_max_time_ms == 0:
      raise ValueError("reward='time_scaled' discounts by the page's clock, which episode_max_time_ms=0 turns off; "
                       "pass episode_max_time_ms=None (the page's own limit) or a limit in ms")
    kwargs.setdefault("idle_timeout_ms", 0)
    super().__init__(profile=MINIWOB_PROFILE, observation=observation, fresh_context=fresh_context, **kwargs)
    self.reward = reward
    self.reload_every = reload_every
    self._episodes_on_page = 0
    self.data_mode = data_mode
    self.episode_max_time_ms = episode_max_time_ms
    self._loaded_url: str | None = None
    self._utterance = ""

  def _check_task(self, task: Task) -> None:
    if task.site != "miniwob" or "miniwob_task" not in task.meta:
      raise ValueError(f"Task {task.id!r} is not a MiniWoB task; build it with jaxagent.envs.miniwob.make_task")

  def reset(self, task: Task):
    """Starts `task` on this process's own server: a stored task's `start_url` names the port of the process that
    wrote it (a resumed run, a copied workdir or another machine's worker serves the pages elsewhere), and the
    page is fully named by the task."""
    self._check_task(task)
    return super().reset(dataclasses.replace(task, start_url=base_url() + task_path(task.meta["miniwob_task"])))

  def _begin(self, task: Task) -> None:
    profile = FLIGHT_PROFILE if task.meta["miniwob_task"].startswith("flight.") else MINIWOB_PROFILE
    reload = (self.fresh_context or self._context is None or self._page is None or self._page.is_closed()
              or self._page_crashed
              or self._loaded_url != task.start_url or profile != self.profile
              or (self.reload_every and self._episodes_on_page >= self.reload_every))
    if reload:
      self._fixed_profile = profile
      self._loaded_url = None
      self._new_context(task)
      self._page.goto(task.start_url, wait_until="load", timeout=self.load_timeout_ms)
      self._page.wait_for_function("() => typeof core !== 'undefined' && core.cover_div !== null",
                                   timeout=self.load_timeout_ms)
      # The reward panel beside the task is bookkeeping, not part of the task: keep it out of the HTML view.
      self._page.add_style_tag(content="#reward-display, #click-canvas { display: none !important; }")
      self._loaded_url = task.start_url
      self._episodes_on_page = 0
    else:
      self._targets, self._blocked, self._downloads = {}, [], []
      self._page.evaluate("() => core.endEpisode(0)")  # force-stop a running episode (no-op if none)
    self._page.evaluate(
        """([seed, mode, maxTime]) => {
             Math.seedrandom(seed);
             core.setDataMode(mode);
             if (core.PAGE_MAX_TIME === undefined) core.PAGE_MAX_TIME = core.EPISODE_MAX_TIME;  // the page's own
             core.EPISODE_MAX_TIME = maxTime === null ? core.PAGE_MAX_TIME : maxTime;
             core.startEpisodeReal();
           }""", [task.seed, self.data_mode, self._max_time_ms()])
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while not self._page.evaluate("() => WOB_TASK_READY"):
      if time.monotonic() > deadline:
        raise RuntimeError(f"MiniWoB task {task.meta['miniwob_task']!r} never became ready")
      time.sleep(0.02)
    self._episodes_on_page += 1
    while True:  # every task states its goal; an empty one is a page not (re)set, which a retry repairs
      utterance = self._page.evaluate("() => core.getUtterance()")
      self._utterance = utterance["utterance"] if isinstance(utterance, dict) else utterance
      if self._utterance:
        break
      if time.monotonic() > deadline:
        self._page_crashed = True  # the next reset reloads the page
        raise RuntimeError(f"MiniWoB task {task.meta['miniwob_task']!r} started with an empty utterance")
      time.sleep(0.02)

  def _max_time_ms(self) -> int | None:
    """What the page's `core.EPISODE_MAX_TIME` is set to (None: left as the page sets it)."""
    if self.episode_max_time_ms is None:
      return None
    return int(self.episode_max_time_ms) or NO_CLOCK_MS

  def _intent(self) -> str:
    return self._utterance

  def _reward_done(self) -> tuple[float, bool, dict[str, Any]]:
    meta = self._page.evaluate(
        "() => ({done: WOB_DONE_GLOBAL, env_reward: WOB_REWARD_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,"
        " reason: WOB_REWARD_REASON})")
    reward = float(meta["raw_reward"] if self.reward == "raw" else meta["env_reward"]) if meta["done"] else 0.0
    return reward, bool(meta["done"]), {"utterance": self._utterance, "raw_reward": meta["raw_reward"],
                                        "env_reward": meta["env_reward"], "reason": meta["reason"]}
