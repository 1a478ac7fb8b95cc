"""Tabular imitation, filtered imitation and Monte-Carlo Q on the sites' link graph: can the benchmark separate them?

Before any neural run, the benchmark is asked whether its data and dynamics leave room for the orderings the papers
report (Filtered BC over imitation, a critic over Filtered BC). States and actions are abstracted *relative to the
intent*, which is how a policy that reads its instruction generalises to held-out intents: a category page is
"the goal's category, the goal's brand filter on, a wrong sort", a link is "to the goal's category" or "to
another"; the cart "holds exactly the goal's item" or not. On a behaviour policy's episodes:

  IL   samples an action in proportion to its count in the state (behaviour cloning of all the data);
  FBC  the same over the successful episodes only (Filtered BC; IL where a state has no success);
  Q    greedy on the Monte-Carlo return γ^(T−1−t)·R of each (state, action), among the actions the data support
       (discrete BCQ's rule: count ≥ τ × the state's most frequent action's, τ = 0.3; Fujimoto et al. 2019,
       arXiv 1910.01708), IL where the state is unseen;
  BoN  Best-of-N: N actions sampled from IL, the one with the highest Q (Digi-Q's extraction).

The IL and FBC policies are sampled, as the recipes evaluate their actors at temperature ≥ 0.8.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import re
import urllib.parse
from typing import Any, Hashable, Sequence

from jaxagent.envs.sites import pages
from jaxagent.envs.sites.linkgraph import Act, LinkEnv
from jaxagent.types import Task

State = Hashable
Key = Hashable
GAMMA = 0.95
BCQ_TAU = 0.3
_PRODUCT = re.compile(r"/shop/p/(\d+)")
_THREAD = re.compile(r"/forum/t/(\d+)")
_USER = re.compile(r"/forum/u/([^'\"\]]+)")
_OPTION = re.compile(r"opt-(colour|size)\[href\*='(?:colour|size)=([^']+)'\]")


def goal_of(task: Task) -> dict[str, Any]:
  """What the task wants, as values to compare pages and actions with: its parameters plus the entities and
  options its oracle visits, and the texts it types or answers."""
  params = dict(task.meta.get("params", {}))
  goal: dict[str, Any] = {k: params[k] for k in ("category", "brand", "colour", "size") if params.get(k)}
  sort = params.get("order") or params.get("superlative")
  if sort in ("price_asc", "price_desc", "rating", "reviews"):
    goal["sort"] = sort
  if params.get("shipping"):
    goal["shipping"] = params["shipping"]
  for step in task.oracle or []:
    sel = step.get("selector", "")
    for pattern, key in ((_PRODUCT, "product"), (_THREAD, "thread"), (_USER, "user")):
      m = pattern.search(sel)
      if m and key not in goal:
        goal[key] = m.group(1)
    m = _OPTION.search(sel)
    if m:
      goal[m.group(1)] = m.group(2)
    if step["op"] == "type":
      goal.setdefault("typed", {})[sel.lstrip("#")] = step["text"]
      if sel == "#q":
        goal.setdefault("queries", set()).add(step["text"])
    if step["op"] == "answer":
      goal.setdefault("answers", set()).add(step["text"])
  return goal


def _rel(value: str, want: Any) -> str:
  if not value:
    return "∅"
  if want is None:
    return "·"
  return "=" if value == want else "≠"


def abstract_url(url: str, goal: dict[str, Any]) -> tuple:
  """A site-relative URL as (page kind, relations of its entity and query to the goal)."""
  parts = urllib.parse.urlsplit(url)
  segs = [s for s in parts.path.split("/") if s]
  query = dict(urllib.parse.parse_qsl(parts.query))
  rels: list[tuple[str, str]] = []
  if len(segs) >= 3 and segs[:2] == ["shop", "c"]:
    kind = "shop/c"
    rels.append(("category", _rel(segs[2], goal.get("category"))))
  elif len(segs) >= 3 and segs[:2] == ["shop", "p"]:
    kind = "shop/p"
    rels.append(("product", _rel(segs[2], goal.get("product"))))
  elif len(segs) >= 3 and segs[:2] == ["forum", "t"]:
    kind = "forum/t"
    rels.append(("thread", _rel(segs[2], goal.get("thread"))))
  elif len(segs) >= 3 and segs[:2] == ["forum", "u"]:
    kind = "forum/u"
    rels.append(("user", _rel(urllib.parse.unquote(segs[2]), goal.get("user"))))
  else:
    kind = "/".join(s if not s.isdigit() else "#" for s in segs[:3]) or "/"
  for key in ("brand", "colour", "size", "sort"):
    if key in query or key in goal:
      rels.append((key, _rel(query.get(key, ""), goal.get(key))))
  if "q" in query:
    rels.append(("q", "=" if query["q"] in goal.get("queries", ()) else "≠"))
  if "err" in query:
    rels.append(("err", "1"))
  return (kind, tuple(rels))


def abstract_state(env: LinkEnv, goal: dict[str, Any], checks: Sequence[dict[str, Any]]) -> State:
  """Where the episode is, relative to the goal: the page, an interstitial or error, cookie consent, each of the
  judge's state checks (holds / empty / other), and the typed fields."""
  st = env.state
  flags = ("popup" if st.popup_open else "", "failed" if pages.select(env.page, "#retry") else "",
           "consent" if st.cookie_consent else "")
  state_json = st.to_json() if checks else {}
  held = tuple(_check_relation(state_json, c) for c in checks)
  ids = {f.name: f.node.id for form in env.page.forms for f in form.fields}
  typed = tuple(sorted((k, "=" if goal.get("typed", {}).get(ids.get(k, k)) == v else "≠")
                       for k, v in env.typed.items()))
  return (abstract_url(env.url, goal), flags, held, typed)


def _check_relation(state: dict[str, Any], check: dict[str, Any]) -> str:
  value: Any = state
  for key in check["path"].split("."):
    value = value.get(key) if isinstance(value, dict) else None
  if value in (None, [], {}):
    return "∅"
  return "=" if _same(value, check.get("equals", check.get("contains"))) else "≠"


def _same(actual: Any, expected: Any) -> bool:
  if isinstance(expected, list):
    return isinstance(actual, list) and len(actual) == len(expected) and all(
        _same(a, e) for a, e in zip(actual, expected))
  if isinstance(expected, dict):
    if isinstance(actual, list):
      return any(_same(a, expected) for a in actual)
    return isinstance(actual, dict) and all(k in actual and _same(actual[k], v) for k, v in expected.items())
  if isinstance(expected, str) and isinstance(actual, str):
    return actual.strip().lower() == expected.strip().lower()
  return actual == expected


def state_checks(evaluator: dict[str, Any]) -> list[dict[str, Any]]:
  """The judge's server-state checks, wherever they sit in its spec (the rubric aside)."""
  out: list[dict[str, Any]] = []
  if evaluator.get("kind") == "state_match":
    out += evaluator["checks"]
  for sub in evaluator.get("checks", []) if evaluator.get("kind") in ("all", "any") else []:
    out += state_checks(sub)
  return out


def abstract_action(act: Act, goal: dict[str, Any]) -> Key:
  if act.kind == "link":
    return ("link", abstract_url(act.target, goal))
  if act.kind == "search":
    return ("search", "=" if act.text in goal.get("queries", ()) else "≠")
  if act.kind == "type":
    field = act.node.id if act.node is not None else act.target
    return ("type", act.target, "=" if goal.get("typed", {}).get(field) == act.text else "≠")
  if act.kind == "choose":
    return ("choose", act.target, _rel(act.text, goal.get(act.target)))
  if act.kind == "submit":
    return ("submit", abstract_url(act.target, goal)[0])
  if act.kind == "answer":
    return ("answer", "=" if act.text in goal.get("answers", ()) else "≠")
  return (act.kind,)


@dataclasses.dataclass
class Transition:
  state: State
  action: Key


@dataclasses.dataclass
class Tables:
  """Counts and Monte-Carlo returns per (abstract state, abstract action) from behaviour episodes."""

  gamma: float = GAMMA
  count: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
  success_count: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
  ret_sum: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))

  def add(self, transitions: Sequence[Transition], success: float) -> None:
    n = len(transitions)
    for t, tr in enumerate(transitions):
      self.count[tr.state][tr.action] += 1
      if success:
        self.success_count[tr.state][tr.action] += 1
      self.ret_sum[tr.state][tr.action] += success * self.gamma ** (n - 1 - t)

  def q(self, state: State, action: Key) -> float | None:
    n = self.count.get(state, {}).get(action, 0)
    return self.ret_sum[state][action] / n if n else None


class TabularActor:
  """A link-level policy from `Tables`: `mode` is il | fbc | q | bon (see the module docstring)."""

  MODES = ("il", "fbc", "q", "bon")

  def __init__(self, tables: Tables, mode: str, n: int = 8):
    if mode not in self.MODES:
      raise ValueError(f"mode {mode!r}: use one of {self.MODES}")
    self.tables, self.mode, self.n = tables, mode, n

  def begin(self, env: LinkEnv) -> None:
    self.goal = goal_of(env.task)
    self.checks = state_checks(env.task.evaluator)

  def act(self, env: LinkEnv, acts: Sequence[Act], rng: random.Random) -> Act:
    s = abstract_state(env, self.goal, self.checks)
    groups: dict[Key, list[Act]] = collections.defaultdict(list)
    for a in acts:
      groups[abstract_action(a, self.goal)].append(a)
    key = self._choose(s, list(groups), rng)
    return rng.choice(groups[key]) if key is not None else rng.choice(list(acts))

  def _sample(self, counts: dict, keys: list, rng: random.Random) -> Key | None:
    seen = [(k, counts.get(k, 0)) for k in keys if counts.get(k, 0)]
    if not seen:
      return None
    r = rng.random() * sum(c for _, c in seen)
    for k, c in seen:
      r -= c
      if r < 0:
        return k
    return seen[-1][0]

  def _choose(self, s: State, keys: list, rng: random.Random) -> Key | None:
    t = self.tables
    il = lambda: self._sample(t.count.get(s, {}), keys, rng)  # noqa: E731
    if self.mode == "il":
      return il()
    if self.mode == "fbc":
      return self._sample(t.success_count.get(s, {}), keys, rng) or il()
    if self.mode == "q":
      counts = t.count.get(s, {})
      top = max((counts.get(k, 0) for k in keys), default=0)
      scored = [(t.q(s, k), k) for k in keys if counts.get(k, 0) and counts[k] >= BCQ_TAU * top]
      if not scored:
        return il()
      best = max(q for q, _ in scored)
      return rng.choice([k for q, k in scored if q == best])
    candidates = [il() for _ in range(self.n)]
    candidates = [k for k in candidates if k is not None]
    if not candidates:
      return None
    return max(candidates, key=lambda k: (t.q(s, k) if t.q(s, k) is not None else -1.0))
