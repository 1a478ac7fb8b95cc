"""The text backend against Chromium, in lockstep on the same server: at every step the WebRL prompt (the compact
simplified HTML, what the recipe's actor is prompted with) is byte for byte Chromium's, and so are the URL, the
title, the error and the warning, and the elements' ids and attributes; after every episode both sessions hold
the same server state. The actions come from the expert, a noisy expert and a policy of random actions of every
kind, on every benchmark family at every perturbation level; the pages they reach cover every page type of
every site."""

import dataclasses
import random
import re
import zlib

import pytest

from jaxagent.agents.autoui_text import AutoUIText
from jaxagent.agents.webrl import WebRL
from jaxagent.envs.sites import bench, expert, server
from jaxagent.envs.sites import tasks as tasks_lib
from jaxagent.envs.sites.env import SiteEnv
from jaxagent.envs.sites.text_env import SiteTextEnv, form_urlencode
from jaxagent.envs.sites.urls import PLACEHOLDER
from jaxagent.judges import evaluators
from jaxagent.types import Action, ActionKind, Step

pytestmark = pytest.mark.browser

FORMAT = WebRL(compact=True)
_SESSION = re.compile(r"/s/[0-9a-f]+/")


@pytest.fixture(scope="module")
def site():
  with server.SiteServer() as s:
    yield s.base_url


@pytest.fixture(scope="module")
def chrome(site):
  with SiteEnv(profile="web", observation="html", oracle_targets=True, base_url=site) as env:
    yield env


class RandomActions:
  """Uniform over action kinds, then over elements and texts: what a policy that has learned nothing does (and a
  navigation off the site, which WebRL cannot write but the env must refuse alike)."""

  TEXTS = ("shoes", "Ada Lovelace", "42 Main St", "red", "xyz", "")

  def __init__(self, seed: int):
    self.rng = random.Random(seed)

  def next_action(self, obs, history, slot=0):
    rng, elements = self.rng, obs.elements
    element = rng.choice(elements).index if elements else None
    kind = rng.choice(["click", "click", "click", "type", "type", "select", "back", "forward", "key", "scroll",
                       "hover", "home", "bad", "away"])
    if kind == "click":
      return Action(ActionKind.CLICK, element=element), ""
    if kind == "type":
      return Action(ActionKind.TYPE, element=element, text=rng.choice(self.TEXTS), enter=rng.random() < 0.5), ""
    if kind == "select":
      return Action(ActionKind.SELECT, element=element, text=rng.choice(["S", "M", "blue", "Express", "zzz"])), ""
    if kind == "key":
      return Action(ActionKind.KEY, key="Enter"), ""  # WebRL's one key (Tab's focus order is not modelled)
    if kind == "scroll":
      return Action(ActionKind.SCROLL, direction=rng.choice(["down", "up"])), ""
    if kind == "hover":
      return Action(ActionKind.HOVER, element=element), ""
    if kind == "away":  # outside the task's origins: blocked, with the same error
      return Action(ActionKind.GOTO, url="http://example.invalid/elsewhere"), ""
    if kind == "bad":
      return Action(ActionKind.CLICK, element=len(elements) + 5), ""
    return Action({"back": ActionKind.BACK, "forward": ActionKind.FORWARD, "home": ActionKind.HOME}[kind]), ""


def _first_diff(a: str, b: str) -> str:
  i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
  print(f"first difference at {i}:\ntext backend: ...{a[max(0, i - 300):i + 300]}\nchromium:     ...{b[max(0, i - 300):i + 300]}")
  return f"text: ...{a[max(0, i - 200):i + 200]!r}\nchromium: ...{b[max(0, i - 200):i + 200]!r}"


def _warned(obs) -> str:
  return re.sub(r"tag name is <\w+>", "tag name is <...>", obs.extra.get("warning", ""))


def _norm(value) -> str:
  """Two sessions' pages differ in their URLs' session ids only."""
  return _SESSION.sub("/s/SESSION/", repr(value))


def _same_state(site, a: str, b: str) -> None:
  sa, sb = server.fetch_state(site, a), server.fetch_state(site, b)
  for s in (sa, sb):
    s.pop("session")
  assert _norm(sa) == _norm(sb)


def _page_type(url: str, html: str) -> str:
  if "Page not found" in html:
    return "not found"
  if "Enjoying the app?" in html:
    return "interstitial"
  if "Something went wrong" in html:
    return "failure page"
  parts = _SESSION.split(url.split("?")[0], 1)[-1].strip("/").split("/")
  if len(parts) >= 3 and parts[1] in ("c", "b", "u", "t", "p"):
    return f"{parts[0]}/{parts[1]}/X"
  return "/".join(parts[:2])


def lockstep(chrome, text, task, policy, site, seen: set[str], fmt=FORMAT) -> tuple[int, object]:
  """Plays `policy` (reading Chromium's observations) in both envs at once, comparing the prompts `fmt` builds;
  returns (steps, trajectory)."""
  oc, ot = chrome.reset(task), text.reset(task)
  history, steps = [], []
  for k in range(task.max_steps + 1):
    pt, pc = fmt.build_prompt(task, ot, history), fmt.build_prompt(task, oc, history)
    assert pt == pc, (task.id, k, oc.url, _first_diff(pt, pc))
    assert _norm(ot.url) == _norm(oc.url), (task.id, k)
    assert (ot.title, ot.error) == (oc.title, oc.error), (task.id, k)
    # WebVoyager's typing warning names the element under the click point (layout); WebRL's prompt has none
    assert _warned(ot) == _warned(oc), (task.id, k)
    assert _norm([(e.index, e.tag, e.attrs) for e in ot.elements]) == _norm(
        [(e.index, e.tag, {a: v for a, v in e.attrs.items() if a != "data-bbox"}) for e in oc.elements]), (task.id, k)
    seen.add(_page_type(oc.url, oc.html))
    if k == task.max_steps:
      break
    action, _ = policy.next_action(oc, history)
    history.append(Step(step=k, action=action, action_text=_render(action, fmt)))
    oc, _, done_c, info_c = chrome.step(action)
    ot, _, done_t, info_t = text.step(action)
    assert (done_t, info_t["truncated"], info_t["answer"]) == (done_c, info_c["truncated"], info_c["answer"])
    steps.append(action)
    if done_c:
      break
  _same_state(site, chrome.bound_task.meta["session"], text.bound_task.meta["session"])
  return len(steps), history


def _render(action: Action, fmt=FORMAT) -> str:
  try:
    return fmt.render(action)
  except ValueError:  # an action WebRL cannot write (home): its kind, so the next prompt's history still grows
    return action.kind.value


FAMILIES = ("order", "filter", "lookup", "cart", "thread", "reply", "buy")
PAGE_TYPES = {"shop", "shop/search", "shop/c/X", "shop/p/X", "shop/cart", "shop/checkout", "shop/orders", "shop/deal",
              "forum", "forum/search", "forum/b/X", "forum/t/X", "forum/u/X", "settings", "interstitial",
              "failure page", "not found"}


@pytest.mark.slow
# Level 2 meets every page type. The README's command plays the expert on every family and the noisy expert and
# random actions on every third (`sampled`); the long lane plays all three on every family, at each level (levels
# 0 and 1: fewer perturbations, a subset of the pages).
@pytest.mark.parametrize("level, sampled", [pytest.param(0, False, marks=pytest.mark.long),
                                            pytest.param(1, False, marks=pytest.mark.long),
                                            pytest.param(2, False, marks=pytest.mark.long), (2, True)])
def test_text_backend_is_chromium_byte_for_byte(chrome, site, level, sampled):
  seen: set[str] = set()
  rng = random.Random(level)
  with SiteTextEnv(profile="web", oracle_targets=True, base_url=site) as text:
    for i, family in enumerate(FAMILIES):
      tasks = bench.tasks_for(f"web/test_comb@{level}/{family}")
      task = rng.choice(tasks)
      lockstep(chrome, text, task, expert.ScriptedExpert("webrl"), site, seen)
      noisy, rand = rng.choice(tasks), rng.choice(tasks)  # drawn either way: the same episodes in both cuts
      if not sampled or i % 3 == 0:
        lockstep(chrome, text, noisy, expert.NoisyExpert("webrl", epsilon=0.4, seed=level), site, seen)
      if not sampled or i % 3 == 1:
        lockstep(chrome, text, rand, RandomActions(seed=zlib.crc32(f"{level}{family}".encode())), site, seen)
    settings = [t for t in tasks_lib.generate(0)["test"] if t.template == "settings_toggle" and t.profile == "text"]
    lockstep(chrome, text, settings[0], expert.ScriptedExpert("webrl"), site, seen)
    if level == 2:  # the risky deal, taken: one that has expired (one that works redirects to a listing)
      deal = next(t for t in bench.tasks_for("web/test_comb@2/buy")
                  if server.perturbation_of(t).has_deal and not server.perturbation_of(t).deal_works)
      lockstep(chrome, text, deal, expert.NoisyExpert("webrl", epsilon=0.0, shortcut=1.0), site, seen)
    for path in ("shop/nowhere", "forum/u/uma", "shop/c/nothing"):  # pages no policy above needs to reach
      lockstep(chrome, text, _start_on(path, level), RandomActions(seed=1), site, seen)
  required = PAGE_TYPES - {0: {"interstitial", "failure page", "shop/deal"}, 1: {"failure page", "shop/deal"},
                           2: set()}[level]
  assert required <= seen, sorted(required - seen)


def _start_on(path: str, level: int):
  task = bench.tasks_for(f"web/test_comb@{level}/order")[0]
  return dataclasses.replace(task, id=f"{task.id}:{path}", start_url=f"{PLACEHOLDER}/{path}", max_steps=4)


def test_expert_solves_every_family_in_the_text_backend(site):
  """As in Chromium (docs/benchmark.md): the expert succeeds on each web family at perturbation level 2."""
  with SiteTextEnv(profile="web", oracle_targets=True, base_url=site) as text:
    for family in FAMILIES:
      for task in bench.tasks_for(f"web/test_iid@2/{family}")[:3]:
        traj = expert.run_episode(text, expert.ScriptedExpert("webrl"), task)
        assert evaluators.evaluate(task, traj).success == 1.0, (task.id, [s.action_text for s in traj.steps])


@pytest.mark.slow
def test_a_fast_lane_episode_matches_chromium(chrome, site):
  seen: set[str] = set()
  task = bench.tasks_for("web/test_iid@2/buy")[0]
  with SiteTextEnv(profile="web", oracle_targets=True, base_url=site) as text:
    n, _ = lockstep(chrome, text, task, expert.ScriptedExpert("webrl"), site, seen)
  assert n >= 5 and "shop/checkout" in seen


def test_forms_are_encoded_as_browsers_encode_them():
  assert form_urlencode([("q", "red shoes"), ("n", "a*b~c/é")]) == "q=red+shoes&n=a*b%7Ec%2F%C3%A9"


def test_screen_points_and_other_observers_are_refused(site):
  with pytest.raises(ValueError, match="observation='html'"):
    SiteTextEnv(observation="som")
  with SiteTextEnv(profile="web", base_url=site) as text:
    text.reset(bench.tasks_for("web/test_comb@0/order")[0])
    obs, _, _, info = text.step(Action(ActionKind.CLICK, x=0.5, y=0.5, normalized=True))
    assert info["error"] and obs.error == info["error"]


# ------------------------------------------------------------------------------------------------ the phone

PHONE_FORMAT = AutoUIText(max_page_chars=10**6)  # DigiRL's text observation, uncut: every byte compared


@pytest.fixture(scope="module")
def phone(site):
  with SiteEnv(profile="device", observation="html", oracle_targets=True, base_url=site) as env:
    yield env


def _phone_tasks():
  """One train task of every phone family of the sites' suite (DigiRL's and Digi-Q's tasks)."""
  by_template = {}
  for t in tasks_lib.generate(0)["train"]:
    if t.profile == "device":
      by_template.setdefault(t.template, t)
  return [by_template[k] for k in sorted(by_template)]


@pytest.mark.slow
def test_a_phone_episode_as_text_matches_chromium(phone, site):
  """DigiRL's `env.observation=html` on the text backend: the prompt at every step is what Chromium's phone shows."""
  task = next(t for t in _phone_tasks() if t.template == "shop_category_sort")
  with SiteTextEnv(profile="device", oracle_targets=True, base_url=site) as text:
    n, history = lockstep(phone, text, task, expert.ScriptedExpert("autoui_text"), site, set(), PHONE_FORMAT)
  assert n >= 4 and history[-1].action.kind == ActionKind.ANSWER


@pytest.mark.slow
@pytest.mark.long  # every phone family × three policies; the README's command plays one episode (above)
def test_the_phone_as_text_is_chromium_byte_for_byte(phone, site):
  """Every phone family, by the expert, a noisy expert (its swipes, random taps and early stops) and random
  actions: the phone's text observation, URL, title, errors, elements and server state as Chromium's."""
  seen: set[str] = set()
  with SiteTextEnv(profile="device", oracle_targets=True, base_url=site) as text:
    for k, task in enumerate(_phone_tasks()):
      lockstep(phone, text, task, expert.ScriptedExpert("autoui_text"), site, seen, PHONE_FORMAT)
      lockstep(phone, text, task, expert.NoisyExpert("autoui_text", epsilon=0.4, seed=k), site, seen, PHONE_FORMAT)
      lockstep(phone, text, task, RandomActions(seed=k), site, seen, PHONE_FORMAT)
  assert {"shop", "shop/c/X", "shop/p/X", "forum", "forum/t/X", "settings"} <= seen, sorted(seen)


@pytest.mark.slow
def test_the_expert_solves_every_phone_family_as_text(site):
  """DigiRL's text observation has demonstrations to learn from: the expert's element taps solve each family."""
  with SiteTextEnv(profile="device", oracle_targets=True, base_url=site) as text:
    for task in _phone_tasks():
      traj = expert.run_episode(text, expert.ScriptedExpert("autoui_text"), task)
      assert evaluators.evaluate(task, traj).success == 1.0, (task.id, [s.action_text for s in traj.steps])
