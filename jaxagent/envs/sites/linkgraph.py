"""The bundled sites as a link graph, explored in-process: pages, their actions and their effects, no browser.

A page is a deterministic function of (URL, session state, perturbation), so an episode can run against the
server's own request handler (`app.respond`) in this process: the actions of a page are its links, its forms (a
search submitted with a text, a text typed into a field, a radio chosen, a form submitted), BACK and, on the
phone, HOME; an answer or a stop ends the episode. This is the level at which the benchmark's tabular check
(`bench_tabular`) compares imitation, filtered imitation and Q-learning, and at which its expert, noisy and random
policies are measured cheaply. Scrolling does not exist here: it is the browser's business.
"""

from __future__ import annotations

import dataclasses
import random
import urllib.parse
from typing import Any, Sequence

from jaxagent.envs.sites import app as app_lib
from jaxagent.envs.sites import catalog, pages, server
from jaxagent.envs.sites import state as state_lib
from jaxagent.envs.sites.urls import PLACEHOLDER, shows
from jaxagent.types import Step, Task, Trajectory

SESSION = "graph"
ROOT = f"/s/{SESSION}"
ORIGIN = "http://graph.local"  # URLs in trajectories look like the server's, so the judges read them unchanged
DISTRACTOR = "something else"
INTERRUPTS = ("#popup-close", "#retry")  # what the expert clears before following the oracle


@dataclasses.dataclass(frozen=True)
class Act:
  """One action: `kind` is link | search | type | choose | submit | back | home | answer | stop."""

  kind: str
  target: str = ""  # link: the site-relative URL; search/submit: the form's action; type/choose: the field name
  text: str = ""  # the typed, chosen or answered value
  form: int = -1  # the form's index on its page
  node: Any = dataclasses.field(default=None, compare=False, hash=False)

  def __str__(self) -> str:
    return f"{self.kind}({self.target!r}{', ' + repr(self.text) if self.text else ''})"


class LinkEnv:
  """One episode at a time on the sites of `world_seed`, in this process."""

  def __init__(self, world_seed: int = 0, device: bool | None = None):
    self.world = catalog.build_world(world_seed)
    self.device = device
    self.task: Task | None = None

  # -------------------------------------------------------------------------------------------- episode

  def reset(self, task: Task) -> pages.Page:
    self.task = task
    self.state = state_lib.SessionState(perturbation=server.perturbation_of(task))
    self.history: list[str] = []
    self.url = ""
    self.typed: dict[str, str] = {}
    self.urls: list[str] = []
    self.answer: str | None = None
    self.done = False
    start = task.start_url.replace(PLACEHOLDER, "")
    self._get(start)
    return self.page

  @property
  def has_home(self) -> bool:
    return self.device if self.device is not None else (self.task is not None and self.task.profile == "device")

  def actions(self) -> list[Act]:
    """What can be done on this page: its links and forms (texts to type come from the instruction,
    `meta["texts"]`, plus one distractor), BACK, HOME on the phone, and ending: an answer shown on this page or
    "I am not sure.", or a stop for a task without an answer."""
    acts: list[Act] = []
    for link in self.page.links:
      href = _inside(link.href)
      if href is not None:
        acts.append(Act("link", href, node=link.node))
    texts = list(dict.fromkeys(list(self.task.meta.get("texts", [])) + [DISTRACTOR]))
    for k, form in enumerate(self.page.forms):
      action = _inside(form.action) or ""
      text_fields = [f for f in form.fields if f.tag == "textarea" or f.type in ("text", "search", "")]
      if form.method == "GET":
        for f in text_fields:
          acts += [Act("search", action, t, k, node=form.node) for t in texts]
        continue
      for f in text_fields:
        acts += [Act("type", f.name, t, k, node=f.node) for t in texts if self.typed.get(f.name) != t]
      for f in form.fields:
        if f.type == "radio" and not self._checked(form, f.name, f.value):
          acts.append(Act("choose", f.name, f.value, k, node=form.node))
      acts.append(Act("submit", action, "", k, node=form.node))
    acts.append(Act("back"))
    if self.has_home:
      acts.append(Act("home"))
    answers = [s["text"] for s in (self.task.oracle or []) if s["op"] == "answer"]
    for t in dict.fromkeys([a for a in answers if a in self.page.text] + ["I am not sure."]):
      acts.append(Act("answer", text=t))  # an answer is read off the page it is on
    if not answers:
      acts.append(Act("stop"))
    return acts

  def step(self, act: Act) -> pages.Page:
    if self.done:
      raise RuntimeError("the episode is over; reset first")
    if act.kind == "link":
      self._navigate(act.target)
    elif act.kind == "search":
      form = self.page.forms[act.form]
      name = next(f.name for f in form.fields if f.type in ("text", "search", ""))
      values = {f.name: f.value for f in form.fields if f.type == "hidden"}
      values[name] = act.text
      self._navigate(act.target + "?" + urllib.parse.urlencode(values))
    elif act.kind in ("type", "choose"):
      self.typed[act.target] = act.text
    elif act.kind == "submit":
      self._submit(self.page.forms[act.form], act.target)
    elif act.kind == "back":
      if self.history:
        self._get(self.history.pop())
    elif act.kind == "home":
      self._navigate("/launcher/")
    elif act.kind in ("answer", "stop"):
      self.answer = act.text if act.kind == "answer" else "Done."
      self.done = True
    else:
      raise ValueError(f"unknown action kind {act.kind!r}")
    return self.page

  def full_url(self, url: str | None = None) -> str:
    return f"{ORIGIN}{ROOT}{url if url is not None else self.url}"

  # ------------------------------------------------------------------------------------------- requests

  def _checked(self, form: pages.Form, name: str, value: str) -> bool:
    if name in self.typed:
      return self.typed[name] == value
    return any(f.name == name and f.value == value and f.checked for f in form.fields)

  def _submit(self, form: pages.Form, action: str) -> None:
    values: dict[str, str] = {}
    for f in form.fields:
      if f.type == "radio":
        if self._checked(form, f.name, f.value):
          values[f.name] = f.value
      elif f.name:
        values[f.name] = self.typed.get(f.name, f.value)
    self._request("POST", action, values)

  def _navigate(self, url: str) -> None:
    if self.url:
      self.history.append(self.url)
    self._get(url)

  def _get(self, url: str) -> None:
    self._request("GET", url, {})

  def _request(self, method: str, url: str, form: dict[str, str], hops: int = 0) -> None:
    parsed = urllib.parse.urlsplit(url)
    path = parsed.path.lstrip("/")
    site, _, rest = path.partition("/")
    if site not in app_lib.HANDLERS:
      raise ValueError(f"{url!r} names no site; the sites are {list(app_lib.HANDLERS)}")
    query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
    reply = app_lib.respond(self.world, self.state, SESSION, site, rest, query, form, method)
    if reply.location:
      if hops > 5:
        raise RuntimeError(f"too many redirects from {url!r}")
      if method == "POST" and self.url:
        self.history.append(self.url)
      return self._request("GET", _inside(reply.location) or "/launcher/", {}, hops + 1)
    if method == "POST" and self.url and not hops:
      self.history.append(self.url)  # a POST that renders (a form error) is a new entry, as in the browser
    self.url = url
    self.typed = {}
    self.html = reply.html
    self.page = pages.parse(reply.html)
    self.urls.append(self.full_url())


def _inside(href: str) -> str | None:
  """`/s/<session>/shop/c/x?y` -> `/shop/c/x?y`; None for anything else (external or empty)."""
  if not href:
    return None
  path = urllib.parse.urlsplit(href)
  if path.scheme or path.netloc or not path.path.startswith(ROOT + "/"):
    return None
  rest = path.path[len(ROOT):]
  return rest + (f"?{path.query}" if path.query else "")


# ------------------------------------------------------------------------------------------------ policies


class LinkExpert:
  """The scripted expert at the link level: clears an interstitial or a failed page, skips navigation steps the
  page already satisfies (`done_if`), then follows the oracle, rewinding to an earlier step whose target is here
  (or going back) after a detour."""

  def __init__(self, max_recoveries: int = 3):
    self.max_recoveries = max_recoveries

  def begin(self, env: LinkEnv) -> None:
    self.pos, self.backs, self.furthest = 0, 0, 0

  def act(self, env: LinkEnv, acts: Sequence[Act], rng: random.Random) -> Act:
    for sel in INTERRUPTS:
      nodes = pages.select(env.page, sel)
      if nodes:
        return _act_for(env, acts, nodes[0]) or _find(acts, "back")
    oracle = env.task.oracle or []
    while self.pos < len(oracle):
      step = oracle[self.pos]
      op = step["op"]
      if step.get("done_if") and shows(step["done_if"], env.url):
        self.pos += 1
        continue
      if op == "stop":
        return _find(acts, "stop") or _find(acts, "answer")
      if op == "home":
        self.pos += 1
        return _find(acts, "home")
      act = None
      if op == "answer":
        act = _find(acts, "answer", text=step["text"])  # offered where the page shows it
      elif nodes := pages.select(env.page, step["selector"]):
        act = (_type_act(env, acts, nodes[0], step["text"]) if op == "type" else _act_for(env, acts, nodes[0]))
      if act is None and step.get("optional"):
        self.pos += 1
        continue
      if act is None:
        if self._rewind(env, oracle):
          continue
        self.backs += 1
        if self.backs > self.max_recoveries:
          return _find(acts, "answer", text="I am not sure.")
        return _find(acts, "back")
      self.pos += 1
      if self.pos > self.furthest:
        self.furthest, self.backs = self.pos, 0
      return act
    return _find(acts, "stop") or _find(acts, "answer")

  def _rewind(self, env: LinkEnv, oracle: list[dict[str, Any]]) -> bool:
    if self.backs >= self.max_recoveries:
      return False
    for j in range(self.pos - 1, -1, -1):
      sel = oracle[j].get("selector")
      if sel and not oracle[j].get("optional") and pages.select(env.page, sel):
        self.pos, self.backs = j, self.backs + 1
        return True
    return False


def _find(acts: Sequence[Act], kind: str, text: str | None = None) -> Act | None:
  for a in acts:
    if a.kind == kind and (text is None or a.text == text):
      return a
  return None


def _act_for(env: LinkEnv, acts: Sequence[Act], node) -> Act | None:
  """The action that clicking `node` performs: its link, its radio, or its form's submission."""
  link = env.page.link_of(node)
  if link is not None:
    href = _inside(link.href)
    return next((a for a in acts if a.kind == "link" and a.target == href), None)
  if node.tag == "input" and node.attrs.get("type") == "radio":
    name, value = node.attrs.get("name", ""), node.attrs.get("value", "")
    return next((a for a in acts if a.kind == "choose" and a.target == name and a.text == value), None)
  form = env.page.form_of(node)
  if form is None:
    return None
  k = env.page.forms.index(form)
  return next((a for a in acts if a.kind in ("submit",) and a.form == k), None)


def _type_act(env: LinkEnv, acts: Sequence[Act], node, text: str) -> Act | None:
  """Typing `text` into the field `node`: a search (typed and submitted) or a text kept for its form."""
  form = env.page.form_of(node)
  k = env.page.forms.index(form) if form is not None else -1
  name = node.attrs.get("name", "")
  for a in acts:
    if a.form == k and a.text == text and (a.kind == "search" or (a.kind == "type" and a.target == name)):
      return a
  return None


class NoisyLinkPolicy(LinkExpert):
  """The goal-aware noisy behaviour policy, a controllable mix: with probability `shortcut` the risky deal when it
  is offered; `stop_prob` a wrong early answer; `repair` a wrong sibling of the expert's next link (another brand,
  sort or colour: the same link with one query value changed) that the expert's next action repairs; `epsilon` a
  uniformly random action (answers and stops aside); else the expert, which recovers what it can."""

  def __init__(self, epsilon: float = 0.3, stop_prob: float = 0.02, shortcut: float = 0.5, repair: float = 0.0,
               **kwargs: Any):
    super().__init__(**kwargs)
    for name, p in (("epsilon", epsilon), ("stop_prob", stop_prob), ("shortcut", shortcut), ("repair", repair)):
      if not 0 <= p <= 1:
        raise ValueError(f"{name}={p} must lie in [0, 1]")
    self.epsilon, self.stop_prob, self.shortcut, self.repair = epsilon, stop_prob, shortcut, repair

  def act(self, env: LinkEnv, acts: Sequence[Act], rng: random.Random) -> Act:
    deal = next((a for a in acts if a.kind == "link" and a.target == "/shop/deal"), None)
    if deal is not None and rng.random() < self.shortcut:
      return deal
    if rng.random() < self.stop_prob:
      return _find(acts, "answer", text="I am not sure.")
    if rng.random() < self.epsilon:
      moves = [a for a in acts if a.kind not in ("answer", "stop")]
      return rng.choice(moves)
    pos, backs, furthest = self.pos, self.backs, self.furthest
    act = super().act(env, acts, rng)
    erred, self.erred = self.erred, False
    if self.repair and not erred and act.kind == "link" and rng.random() < self.repair:
      wrong = _siblings(act, acts)
      if wrong:
        self.pos, self.backs, self.furthest = pos, backs, furthest  # the expert's step is still to do: next
        self.erred = True
        return rng.choice(wrong)
    return act

  def begin(self, env: LinkEnv) -> None:
    super().begin(env)
    self.erred = False


def _siblings(act: Act, acts: Sequence[Act]) -> list[Act]:
  """Links to the same page with the same query keys and exactly one value changed."""
  path, _, query = act.target.partition("?")
  mine = dict(urllib.parse.parse_qsl(query))
  out = []
  for a in acts:
    if a.kind != "link" or a is act:
      continue
    p, _, q = a.target.partition("?")
    other = dict(urllib.parse.parse_qsl(q))
    if p == path and other.keys() == mine.keys() and sum(other[k] != mine[k] for k in mine) == 1:
      out.append(a)
  return out


class RandomLinkPolicy:
  """Uniform over the page's actions (answers and stops included)."""

  def begin(self, env: LinkEnv) -> None:
    pass

  def act(self, env: LinkEnv, acts: Sequence[Act], rng: random.Random) -> Act:
    return rng.choice(list(acts))


@dataclasses.dataclass
class Episode:
  task: Task
  steps: list[tuple[str, Act]]  # (page URL, action)
  trajectory: Trajectory  # what a judge reads: URLs as the server's, the answer, `meta["state_url"]`
  state: dict[str, Any]  # the session's final state (what `/__state__/<session>` would serve)


def run(env: LinkEnv, policy, task: Task, seed: int, max_steps: int | None = None) -> Episode:
  """One episode of `policy` on `task` in the link graph (judge it with `ProgrammaticJudge(fetch_state=lambda _:
  episode.state)`)."""
  rng = random.Random(seed)
  env.reset(task)
  policy.begin(env)
  traj = Trajectory(task=task, policy=type(policy).__name__)
  steps: list[tuple[str, Act]] = []
  for k in range(max_steps or task.max_steps):
    acts = env.actions()
    act = policy.act(env, acts, rng)
    if act is None:
      raise RuntimeError(f"{type(policy).__name__} found no action on {env.url} for {task.id}")
    url = env.full_url()
    steps.append((env.url, act))
    env.step(act)
    traj.steps.append(Step(step=k, action_text=str(act), url=url, info={"next_url": env.full_url()}))
    if env.done:
      break
  traj.answer = env.answer or ""
  traj.meta["final_url"] = env.full_url()
  traj.meta["state_url"] = f"{ORIGIN}/__state__/{SESSION}"
  return Episode(task, steps, traj, env.state.to_json())
