"""BrowserEnv on real Chromium and small local pages served by a real HTTP server."""

import os
import signal
import textwrap

import numpy as np
import psutil
import pytest

from jaxagent.envs.browser import FAIL_OBS, BrowserCrashed, BrowserEnv, outside_origins_regex
from jaxagent.envs.miniwob import serve_directory
from jaxagent.types import Action, ActionKind, Task

pytestmark = pytest.mark.browser

PAGES = {
    "index.html": """
      <html><head><title>Fixture</title></head><body style="margin:0">
      <h1 id="status">idle</h1>
      <button id="a" style="position:absolute;left:20px;top:80px;width:120px;height:40px"
              onclick="document.getElementById('status').textContent='clicked A'">Alpha</button>
      <button id="b" style="position:absolute;left:200px;top:80px;width:120px;height:40px"
              onclick="document.getElementById('status').textContent='clicked B'">Beta</button>
      <form style="position:absolute;left:20px;top:160px"
            onsubmit="event.preventDefault();document.getElementById('status').textContent='searched '+this.q.value">
        <input name="q" type="text" aria-label="Search box" value="old" style="width:200px;height:30px">
      </form>
      <select id="size" style="position:absolute;left:20px;top:220px;width:120px;height:30px"
              onchange="document.getElementById('status').textContent='size '+this.value">
        <option value="s">Small</option><option value="m">Medium</option><option value="l">Large</option>
      </select>
      <a id="next" href="next.html" style="position:absolute;left:20px;top:280px">Next page</a>
      <a id="away" href="http://example.invalid/elsewhere" style="position:absolute;left:200px;top:280px">Away</a>
      <a id="tab" href="next.html" target="_blank" style="position:absolute;left:400px;top:280px">New tab</a>
      <a id="dl" href="data.csv" download style="position:absolute;left:600px;top:280px">Download</a>
      <div style="position:absolute;top:3000px">bottom</div>
      </body></html>""",
    "next.html": "<html><head><title>Next</title></head><body><h1>Second page</h1></body></html>",
    "data.csv": "a,b\n1,2\n",
    "phone.html": """
      <html><head><meta name="viewport" content="width=device-width, initial-scale=1"><title>Phone</title></head>
      <body style="margin:0"><h1 id="status">idle</h1>
      <div id="pad" style="position:absolute;left:0;top:400px;width:100%;height:200px;background:#88f"
           onclick="document.getElementById('status').textContent='tapped pad'"></div>
      <div style="height:4000px"></div></body></html>""",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  root = tmp_path_factory.mktemp("site")
  for name, text in PAGES.items():
    (root / name).write_text(textwrap.dedent(text))
  return serve_directory(root)


@pytest.fixture(scope="module")
def env():
  e = BrowserEnv(observation="som")  # no fixed profile: each task's own (web unless a test says otherwise)
  yield e
  e.close()


def _task(site, page="index.html", **kw):
  return Task(id="t", intent="do it", site="fixture", start_url=site + page, **kw)


def _status(env):
  return env.page.inner_text("#status")


def _index(obs, text):
  return next(e.index for e in obs.elements if e.text == text)


@pytest.mark.slow
def test_reset_observes_page_with_screenshot_and_marks(env, site):
  obs = env.reset(_task(site))
  assert obs.url == site + "index.html" and obs.title == "Fixture" and obs.intent == "do it"
  assert obs.screenshot.shape == (768, 1024, 3) and obs.screenshot.dtype == np.uint8
  assert '<button> "Alpha";' in obs.element_text and '"Next page";' in obs.element_text
  assert '<input> "Search box";' in obs.element_text  # empty text input: its aria-label
  assert env.page.evaluate("document.querySelectorAll('div[style*=dashed]').length") == 0  # marks removed


@pytest.mark.slow
def test_som_click_by_index_hits_that_element(env, site):
  obs = env.reset(_task(site))
  obs, reward, done, info = env.step(Action(ActionKind.CLICK, element=_index(obs, "Beta")))
  assert _status(env) == "clicked B" and obs.error == "" and reward == 0.0 and not done
  assert info["url"] == site + "index.html"


@pytest.mark.slow
def test_a11y_ids_click_the_named_node(env, site):
  env.observation = "a11y"
  try:
    obs = env.reset(_task(site))
    line = next(l for l in obs.a11y_tree.split("\n") if "button 'Alpha'" in l)
    node_id = int(line.strip().split("]")[0][1:])
    assert obs.a11y_tree.startswith("[1] RootWebArea 'Fixture'")
    env.step(Action(ActionKind.CLICK, element=node_id))
    assert _status(env) == "clicked A"
  finally:
    env.observation = "som"


def test_html_ids_click_the_labelled_element(env, site):
  env.observation = "html"
  try:
    obs = env.reset(_task(site))
    beta = next(e for e in obs.elements if e.text == "Beta")
    assert f'<button id="{beta.index}"' in obs.html and "data-bbox=" in obs.html
    env.step(Action(ActionKind.CLICK, element=beta.index))
    assert _status(env) == "clicked B"
  finally:
    env.observation = "som"


def test_type_clears_types_and_presses_enter(env, site):
  obs = env.reset(_task(site))
  box = next(e.index for e in obs.elements if e.tag == "input")
  env.step(Action(ActionKind.TYPE, element=box, text="blue shoes", enter=True))
  assert _status(env) == "searched blue shoes"


def test_typing_into_a_non_textbox_warns_like_webvoyager(env, site):
  obs = env.reset(_task(site))
  obs, _, _, info = env.step(Action(ActionKind.TYPE, element=_index(obs, "Alpha"), text="x"))
  assert obs.error == "" and info["warning"] == obs.extra["warning"] == (
      "note: The web element you're trying to type may not be a textbox, and its tag name is <button>, type is None.")


def test_select_option_by_text(env, site):
  obs = env.reset(_task(site))
  sel = next(e.index for e in obs.elements if e.tag == "select")
  env.step(Action(ActionKind.SELECT, element=sel, text="medium"))
  assert _status(env) == "size m"


@pytest.mark.slow  # over 2 s alone
def test_link_navigation_back_and_forward(env, site):
  obs = env.reset(_task(site))
  obs, *_ = env.step(Action(ActionKind.CLICK, element=_index(obs, "Next page")))
  assert obs.url == site + "next.html" and obs.title == "Next"
  obs, *_ = env.step(Action(ActionKind.BACK))
  assert obs.url == site + "index.html"
  obs, *_ = env.step(Action(ActionKind.FORWARD))
  assert obs.url == site + "next.html"
  obs, *_ = env.step(Action(ActionKind.RESTART))
  assert obs.url == site + "index.html"


def test_navigation_outside_allowed_origins_is_blocked(env, site):
  obs = env.reset(_task(site))
  obs, _, done, info = env.step(Action(ActionKind.CLICK, element=_index(obs, "Away")))
  assert obs.url == site + "index.html" and not done
  assert "blocked" in obs.error and "example.invalid" in obs.error
  assert info["blocked"] == ["http://example.invalid/elsewhere"]
  obs, *_ = env.step(Action(ActionKind.GOTO, url="http://example.invalid/other"))
  assert obs.url == site + "index.html" and "blocked" in obs.error
  obs, *_ = env.step(Action(ActionKind.GOTO, url="file:///etc/passwd"))
  assert obs.url == site + "index.html" and "blocked" in obs.error
  obs, *_ = env.step(Action(ActionKind.GOTO, url=site + "next.html"))
  assert obs.url == site + "next.html" and obs.error == ""


def test_outside_origins_regex_matches_only_foreign_urls():
  r = outside_origins_regex(("http://127.0.0.1:8000", "https://*.example.com"))
  inside = ["http://127.0.0.1:8000/a", "http://127.0.0.1:8000", "https://a.example.com/x?y", "data:text/html,hi"]
  outside = ["http://127.0.0.1:80001/", "https://example.com/", "file:///etc/passwd",
             "http://evil.test/?next=http://127.0.0.1:8000"]
  assert not any(r.search(u) for u in inside) and all(r.search(u) for u in outside)


@pytest.mark.slow
def test_no_action_raises_whatever_its_fields(env, site):
  """Malformed or impossible actions become errors in the observation; the episode goes on."""
  env.reset(_task(site, max_steps=100))
  actions = [
      Action(ActionKind.CLICK), Action(ActionKind.CLICK, element=-1), Action(ActionKind.CLICK, x=float("nan"), y=1),
      Action(ActionKind.TYPE, element=10_000, text="x"), Action(ActionKind.SCROLL, direction="sideways"),
      Action(ActionKind.SCROLL, element=0, direction="down"), Action(ActionKind.SWIPE, x=0.5, y=0.5, normalized=True),
      Action(ActionKind.SELECT, element=0, text="no such option"), Action(ActionKind.HOVER),
      Action(ActionKind.KEY, key="NotAKey"), Action(ActionKind.KEY), Action(ActionKind.GOTO),
      Action(ActionKind.GOTO, url="javascript:alert(1)"), Action(ActionKind.GOTO, url="not a url"),
      Action(ActionKind.BACK), Action(ActionKind.BACK), Action(ActionKind.FORWARD), Action(ActionKind.NOOP),
      Action(ActionKind.KEY, key="enter"), Action(ActionKind.TYPE, text="typed into whatever has focus"),
  ]
  for action in actions:
    obs, reward, done, info = env.step(action)
    assert not done and obs.url.startswith(site) and isinstance(obs.error, str), action
  errors = [env.step(a)[0].error for a in actions[:5]]
  assert errors[1:4] == [FAIL_OBS] * 3


def test_new_tab_becomes_active_and_download_is_saved(env, site):
  obs = env.reset(_task(site))
  obs, _, _, info = env.step(Action(ActionKind.CLICK, element=_index(obs, "Download")))
  assert len(info["downloads"]) == 1 and open(info["downloads"][0]).read() == "a,b\n1,2\n"
  obs, *_ = env.step(Action(ActionKind.CLICK, element=_index(obs, "New tab")))
  assert obs.url == site + "next.html" and len(env.page.context.pages) == 2


@pytest.mark.slow
def test_scroll_window_moves_two_thirds_of_viewport(env, site):
  env.reset(_task(site))
  env.step(Action(ActionKind.SCROLL, direction="down"))
  assert env.page.evaluate("window.scrollY") == pytest.approx(768 * 2 / 3, abs=1)
  env.step(Action(ActionKind.SCROLL, direction="up"))
  assert env.page.evaluate("window.scrollY") == 0


def test_failing_and_invalid_actions_feed_back_errors_without_raising(env, site):
  env.reset(_task(site))
  obs, reward, done, info = env.step(Action(ActionKind.CLICK, element=999))
  assert obs.error == FAIL_OBS and info["error"] == FAIL_OBS and not done
  obs, *_ = env.step(Action.invalid("Format ERROR: Both 'Thought' and 'Action' should be included in your reply.\n"))
  assert obs.error.startswith("Format ERROR")
  obs, *_ = env.step(Action(ActionKind.WAIT))
  assert obs.error == ""


def test_answer_ends_episode_and_max_steps_truncate(env, site):
  env.reset(_task(site))
  _, _, done, info = env.step(Action(ActionKind.ANSWER, text="42"))
  assert done and info["answer"] == "42"
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step(Action(ActionKind.WAIT))
  env.reset(_task(site, max_steps=2))
  assert not env.step(Action(ActionKind.NOOP))[2]
  _, _, done, info = env.step(Action(ActionKind.NOOP))
  assert done and info["truncated"]


_LEAVE_TRACES_JS = """async () => {
  document.cookie = 'k=v; max-age=3600';
  localStorage.setItem('k', 'v');
  sessionStorage.setItem('k', 'v');
  await new Promise((ok) => { const r = indexedDB.open('db'); r.onupgradeneeded = () => r.result.createObjectStore('s');
                             r.onsuccess = () => { r.result.close(); ok(); }; });
  await caches.open('c');
  window.open('next.html');
}"""
_TRACES_JS = """async () => [document.cookie, localStorage.length, sessionStorage.length,
  (await indexedDB.databases()).length, (await caches.keys()).length, history.length]"""


@pytest.mark.parametrize("fresh_context", [False, True])
@pytest.mark.slow
def test_nothing_of_an_episode_is_visible_in_the_next(site, fresh_context):
  """Cookies, local and session storage, IndexedDB, cache storage, back-history and open windows: gone at the
  next reset, whether the context is kept (the default) or new; the browser is never relaunched."""
  with BrowserEnv(observation="html", fresh_context=fresh_context) as env:
    env.reset(_task(site))
    pid, context = env.browser_pid, env._context
    with env._context.expect_page():  # the pop-up's page event can come after evaluate returns, on a busy machine
      env.page.evaluate(_LEAVE_TRACES_JS)
    env.page.goto(site + "next.html")
    assert env.page.evaluate(_TRACES_JS) == ["k=v", 1, 1, 1, 1, 3]  # found (history: about:blank, index, next)
    assert len(env._context.pages) == 2
    obs = env.reset(_task(site))
    assert env.page.evaluate(_TRACES_JS) == ["", 0, 0, 0, 0, 2]  # a new tab: about:blank, then the start page
    assert len(env._context.pages) == 1 and obs.url == site + "index.html"
    assert env.browser_pid == pid and (env._context is context) is not fresh_context
    env.step(Action(ActionKind.BACK))  # no page of the last episode to go back to
    assert env.page.url == site + "index.html"


@pytest.mark.slow
def test_a_task_on_another_profile_or_origin_gets_a_new_context(env, site):
  env.reset(_task(site))
  context = env._context
  env.reset(_task(site))
  assert env._context is context
  env.reset(_task(site, "phone.html", profile="device"))
  assert env._context is not context and env.page.evaluate("navigator.maxTouchPoints") > 0
  context = env._context
  env.reset(_task(site, "phone.html", profile="device", allowed_origins=(site.rstrip("/"), "http://127.0.0.1:1")))
  assert env._context is not context


def test_unreachable_start_url_is_a_clear_error(env):
  with pytest.raises(RuntimeError, match="could not open http://127.0.0.1:1/"):
    env.reset(Task(id="dead", intent="", site="fixture", start_url="http://127.0.0.1:1/"))


@pytest.mark.slow
def test_device_profile_tap_at_normalised_point_and_swipe(env, site):
  obs = env.reset(_task(site, "phone.html", profile="device", meta={"home_url": site + "next.html"}))
  assert obs.screenshot.shape == (915, 412, 3) and env.page.evaluate("navigator.maxTouchPoints") > 0
  # The pad spans y in [400, 600] CSS px of a 915 px tall screen.
  env.step(Action(ActionKind.CLICK, x=0.5, y=500 / 915, normalized=True))
  assert env.page.inner_text("#status") == "tapped pad"
  env.step(Action(ActionKind.SWIPE, x=0.5, y=0.8, x2=0.5, y2=0.2, normalized=True))
  assert env.page.evaluate("window.scrollY") > 100
  obs, *_ = env.step(Action(ActionKind.HOME))
  assert obs.url == site + "next.html"
  assert env.reset(_task(site)).screenshot.shape == (768, 1024, 3)  # the next web task gets the desktop again


def _burn(stop):
  while not stop.is_set():
    sum(range(10_000))


@pytest.mark.slow
def test_a_swipe_leaves_the_page_where_it_did_whatever_the_load(env, site):
  """The touch events carry their own times, so the fling after a swipe, and where the page rests, do not depend
  on how fast the machine sent them; the step returns once the fling has ended."""
  import multiprocessing  # pylint: disable=g-import-not-at-top
  task = _task(site, "phone.html", profile="device")
  swipe = Action(ActionKind.SWIPE, x=0.5, y=0.8, x2=0.5, y2=0.3, normalized=True)
  rest = []
  for load in (0, 2, 0, 2):
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=_burn, args=(stop,)) for _ in range(load)]
    for p in busy:
      p.start()
    try:
      env.reset(task)
      env.step(swipe)
      assert env.page.evaluate("window.__jaxagentScrolling") is False  # the step waited for the fling's scrollend
      env.step(swipe)  # its touch would stop a fling still going on
      rest.append(env.page.evaluate("window.scrollY"))
    finally:
      stop.set()
      for p in busy:
        p.join()
  # Idle, within a pixel (the fling's last frame lands a pixel either way with the frames' timing); beside a
  # full test suite and the two busy processes, within ~50 px. One swipe ended anywhere in 765-2,083 px before
  # the events carried their own times.
  assert max(rest) - min(rest) <= 150, rest
  assert min(rest) > 2 * 0.5 * 915  # each drag is half the screen; the flings carry the page further


@pytest.mark.slow
def test_screenshot_observation_numbers_no_elements_and_taps_at_points(site):
  with BrowserEnv(observation="screenshot") as e:
    obs = e.reset(_task(site, "phone.html", profile="device"))
    assert obs.screenshot.shape == (915, 412, 3) and obs.elements == [] and not obs.element_text
    obs, *_ = e.step(Action(ActionKind.CLICK, x=0.5, y=500 / 915, normalized=True))
    assert e.page.inner_text("#status") == "tapped pad" and not obs.error
    obs, *_ = e.step(Action(ActionKind.CLICK, element=0))  # nothing is numbered: an error the episode survives
    assert obs.error == FAIL_OBS
  with pytest.raises(ValueError, match="screenshot"):
    BrowserEnv(observation="pixels")


@pytest.mark.slow
def test_crashed_renderer_raises_then_reset_recovers_without_relaunch(env, site):
  env.reset(_task(site))
  pid = env.browser_pid
  for child in psutil.Process(pid).children(recursive=True):
    if "--type=renderer" in " ".join(child.cmdline()):
      child.kill()
  with pytest.raises(BrowserCrashed, match="renderer crashed"):
    env.step(Action(ActionKind.WAIT))
  obs = env.reset(_task(site))
  assert obs.title == "Fixture" and env.browser_pid == pid


def _chromium_children():
  out = []
  for p in psutil.Process().children(recursive=True):
    try:
      if "chrom" in p.name().lower() and p.status() != psutil.STATUS_ZOMBIE:
        out.append(p.pid)
    except psutil.NoSuchProcess:
      pass
  return out


@pytest.mark.slow
def test_killed_chromium_raises_then_reset_relaunches_and_close_leaves_nothing(site):
  crash_env = BrowserEnv(profile="text", observation="a11y")
  crash_env.reset(_task(site))
  pid = crash_env.browser_pid
  assert pid is not None and psutil.pid_exists(pid)
  os.kill(pid, signal.SIGKILL)
  psutil.Process(pid).wait(5) if psutil.pid_exists(pid) else None
  with pytest.raises(BrowserCrashed):
    crash_env.step(Action(ActionKind.WAIT))
  obs = crash_env.reset(_task(site))
  assert crash_env.browser_pid not in (None, pid) and obs.title == "Fixture" and obs.screenshot is None
  pids = [crash_env.browser_pid] + [c.pid for c in psutil.Process(crash_env.browser_pid).children(recursive=True)]
  crash_env.close()
  assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
  assert not set(pids) & set(_chromium_children())


@pytest.mark.slow
def test_a_browsers_temporary_files_live_in_its_process_temp_root(site):
  """Chromium's own temp directory (its singleton socket's) is under the root the module removes, not in /tmp,
  where each launch used to leave an `org.chromium.Chromium.*` directory behind."""
  from jaxagent.envs import browser  # pylint: disable=g-import-not-at-top
  e = BrowserEnv(observation="som")
  try:
    e.reset(_task(site))
    root = browser.tmp_root()
    assert psutil.Process(e.browser_pid).environ().get("TMPDIR") == root
    singleton = [d for d in os.listdir(root) if d.startswith("org.chromium.Chromium.")]
    assert singleton and os.path.exists(os.path.join(root, singleton[0], "SingletonSocket"))
  finally:
    e.close()


@pytest.mark.slow
def test_browsers_carry_no_secrets(site, monkeypatch):
  """Chromium's processes get a scrubbed environment: no API key by name or by value, the rest kept."""
  monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789abcdef")
  monkeypatch.setenv("JAXAGENT_PLAIN", "plain-value")
  monkeypatch.setenv("INNOCENT_NAME", "sk-live-abcdefghijklmnop")  # a key under a harmless name
  e = BrowserEnv(observation="som")
  try:
    e.reset(_task(site))
    procs = [psutil.Process(e._browser_pid)] + psutil.Process(e._browser_pid).children(recursive=True)  # pylint: disable=protected-access
    seen = 0
    for p in procs:
      try:
        env = p.environ()
      except (psutil.AccessDenied, psutil.NoSuchProcess):
        continue
      if "PATH" not in env:
        continue  # Chromium's zygotes rewrite the memory behind their argv and environ for a process title
      seen += 1
      assert "OPENAI_API_KEY" not in env and "INNOCENT_NAME" not in env, p.cmdline()[:2]
      assert env.get("JAXAGENT_PLAIN") == "plain-value"
    assert seen >= 1  # the browser's own environment at least
  finally:
    e.close()


def test_a_zombie_counts_as_exited_and_a_running_process_is_returned():
  """A closed browser's zygotes wait as zombies for PID 1 to reap them: they hold nothing, so closing does not wait."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  from jaxagent.envs import browser  # pylint: disable=g-import-not-at-top
  done = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; never reaped until wait(): a zombie
  running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
  try:
    zombie = psutil.Process(done.pid)
    deadline = time.monotonic() + 10
    while zombie.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
      time.sleep(0.01)
    start = time.monotonic()
    assert browser._wait_exited([zombie], timeout=5) == []  # pylint: disable=protected-access
    assert time.monotonic() - start < 1
    alive = browser._wait_exited([zombie, psutil.Process(running.pid)], timeout=0.2)  # pylint: disable=protected-access
    assert [p.pid for p in alive] == [running.pid]
  finally:
    running.kill()
    running.wait()
    done.wait()
