"""Programmatic evaluators, as in WebArena (`reference/algorithms.md` §3.1, `new/evaluators.py`).

A task's `evaluator` spec picks the checks:

  {"kind": "string_match", "exact_match": "42"}            # WebArena StringEvaluator, on the final answer
  {"kind": "string_match", "must_include": ["$12.99"]}      # every item must appear in the answer
  {"kind": "string_match", "fuzzy_match": ["..."]}          # a judge callable decides (unjudged without one)
  {"kind": "url_match", "url": "/shop/c/audio?sort=rating"} # WebArena URLExactEvaluator, "GOLD in PRED"
  {"kind": "url_match", "url": "...", "exact": true}        # the query's keys and values exactly these
                                                            # ("ignore": keys left out, default ["page"])
  {"kind": "visited", "url": "/shop/p/12"}                  # some page of the episode matched (a subgoal)
  {"kind": "state_match", "checks": [{"path": "cart", "contains": {"product_id": 3}},
                                     {"path": "settings.wifi", "equals": false}]}  # the sites' server state
  {"kind": "all", "checks": [spec, ...]}                    # EvaluatorComb: scores multiply
  {"kind": "any", "checks": [spec, ...]}                    # one passing check suffices (e.g. the answer, or
                                                            # ending on the page that shows it: AitW's judge
                                                            # reads the final screen, AutoUI cannot answer)

A spec may carry `"rubric": {name: spec, ...}`, subgoal checks reported beside the 0/1 success
(`ProgrammaticJudge.rubric`), never part of it.

Each check returns a `Verdict(success, reason)`; `success` is 1.0 / 0.0, or None when the check cannot be
judged here (a fuzzy match with no judge, WebArena's `program_html`), and the reason says why.
For a bundled site the relative reference URL is compared with the final URL's path inside its session
(`/s/<session>`), and the state comes from the site server's `/__state__/<session>` endpoint; the session is read
from `trajectory.meta["state_url"]`, `task.meta["state_url"]`, or the trajectory's URLs.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any, Callable

import httpx

from jaxagent import local_http
from jaxagent.types import ActionKind, Task, Trajectory, Verdict

# fuzzy(intent, reference, prediction) -> score in [0, 1] (WebArena's llm_fuzzy_match)
FuzzyJudge = Callable[[str, str, str], float]
StateFetcher = Callable[[str], dict]  # state_url -> state JSON
SESSION_URL = re.compile(r"^(https?://[^/]+)/s/([A-Za-z0-9_.-]+)(/.*)?$")


# ---------------------------------------------------------------------------------------- trajectory facts


def final_answer(trajectory: Trajectory) -> str:
  if trajectory.answer:
    return trajectory.answer
  for step in reversed(trajectory.steps):
    if step.action is not None and step.action.kind == ActionKind.ANSWER:
      return step.action.text
  return ""


def final_url(trajectory: Trajectory) -> str:
  """The page the episode ended on: `meta["final_url"]`, the final observation's URL, the URL the last step's
  env info reports after acting (`next_url` / `url`), or else the URL the last step acted on."""
  if trajectory.meta.get("final_url"):
    return trajectory.meta["final_url"]
  final_obs = getattr(trajectory, "final_observation", None)
  if final_obs is not None and final_obs.url:
    return final_obs.url
  for step in reversed(trajectory.steps):
    for key in ("next_url", "url"):
      if step.info.get(key):
        return step.info[key]
    if step.url:
      return step.url
  return ""


def state_url(task: Task, trajectory: Trajectory) -> str:
  infos = [s.info for s in reversed(trajectory.steps)]
  for meta in [trajectory.meta, trajectory.task.meta if trajectory.task else {}, task.meta] + infos:
    if meta.get("state_url"):
      return meta["state_url"]
  for url in [trajectory.meta.get("final_url", "")] + [s.url for s in reversed(trajectory.steps)]:
    m = SESSION_URL.match(url or "")
    if m:
      return f"{m.group(1)}/__state__/{m.group(2)}"
  return ""


# -------------------------------------------------------------------------------------------- string match


def clean_answer(answer: str) -> str:
  """WebArena's StringEvaluator.clean_answer: strip, drop one pair of surrounding quotes, lower-case."""
  answer = answer.strip()
  if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
    answer = answer[1:-1]
  return answer.lower()


def string_match(spec: dict[str, Any], prediction: str, intent: str = "",
                 fuzzy: FuzzyJudge | None = None) -> Verdict:
  pred = clean_answer(prediction)
  if "exact_match" in spec:
    ref = clean_answer(str(spec["exact_match"]))
    ok = pred == ref
    return Verdict(float(ok), f"exact_match: answer {pred!r} {'==' if ok else '!='} {ref!r}")
  if "must_include" in spec:
    refs = [clean_answer(str(r)) for r in _as_list(spec["must_include"])]
    missing = [r for r in refs if r not in pred]
    return Verdict(float(not missing), "must_include: all found" if not missing
                   else f"must_include: answer {pred!r} lacks {missing}")
  if "fuzzy_match" in spec:
    refs = _as_list(spec["fuzzy_match"])
    if fuzzy is None:
      return Verdict(None, "fuzzy_match needs a judge: pass fuzzy=<callable(intent, reference, prediction)>")
    scores = [float(fuzzy(intent, str(r), prediction)) for r in refs]
    ok = all(s >= 0.5 for s in scores)
    return Verdict(float(ok), f"fuzzy_match: judge scores {scores}")
  raise ValueError(f"string_match evaluator {spec} needs one of 'exact_match', 'must_include', 'fuzzy_match'")


def _as_list(x: Any) -> list:
  return list(x) if isinstance(x, (list, tuple)) else [x]


# ----------------------------------------------------------------------------------------------- URL match


def site_relative(url: str) -> str:
  """`http://host/s/<session>/shop/c/x?y=1` -> `/shop/c/x?y=1`; other URLs unchanged."""
  m = SESSION_URL.match(url)
  if not m:
    return url
  return m.group(3) or "/"


def url_match(spec: dict[str, Any], pred_url: str) -> Verdict:
  """WebArena's URLExactEvaluator ("GOLD in PRED"); references may be joined with ' |OR| '.

  Paths must match (a trailing slash aside): exactly for site-relative references, as a substring of
  netloc + path for absolute ones (WebArena's rule); every reference query value must be present. With
  `"exact": true` the query must hold exactly the reference's keys and values (keys in `"ignore"`, default
  `["page"]`, left out on both sides): a wrong extra filter fails.
  """
  refs = [r.strip() for r in str(spec["url"]).split(" |OR| ")]
  if not pred_url:
    return Verdict(0.0, "url_match: the trajectory has no final URL")
  if spec.get("exact"):
    return _url_exact(refs, pred_url, set(_as_list(spec.get("ignore", ["page"]))))
  for ref in refs:
    path_ok, pred, gold = _parse_pair(ref, pred_url)
    pred_q, gold_q = urllib.parse.parse_qs(pred.query), urllib.parse.parse_qs(gold.query)
    query_ok = all(any(v in pred_q.get(k, []) for v in vals) for k, vals in gold_q.items())
    if path_ok and query_ok:
      return Verdict(1.0, f"url_match: {pred_url} matches {ref}")
  return Verdict(0.0, f"url_match: final URL {site_relative(pred_url)} does not match {' or '.join(refs)}")


def _parse_pair(ref: str, pred_url: str) -> tuple[bool, urllib.parse.ParseResult, urllib.parse.ParseResult]:
  """(paths match, parsed prediction, parsed reference); a site-relative reference reads the path in the session."""
  relative = ref.startswith("/")
  pred = urllib.parse.urlparse(site_relative(pred_url) if relative else pred_url)
  gold = urllib.parse.urlparse(ref)
  pred_path, gold_path = pred.path.rstrip("/") or "/", gold.path.rstrip("/") or "/"
  path_ok = (pred_path == gold_path) if relative else (gold.netloc + gold_path) in (pred.netloc + pred_path)
  return path_ok, pred, gold


def _url_exact(refs: list[str], pred_url: str, ignore: set[str]) -> Verdict:
  """Keys and values compared as sets after URL-decoding (parse_qs), so `Pine%20wood` equals `Pine wood`; an empty
  value is no filter (the sites' forms send `brand=` for "All"), as in the default rule."""
  reasons = []
  for ref in refs:
    path_ok, pred, gold = _parse_pair(ref, pred_url)
    if not path_ok:
      reasons.append(f"path {pred.path} is not {gold.path}")
      continue
    have = {k: sorted(v) for k, v in urllib.parse.parse_qs(pred.query).items() if k not in ignore}
    want = {k: sorted(v) for k, v in urllib.parse.parse_qs(gold.query).items() if k not in ignore}
    diffs = ([f"extra filter {k}={'/'.join(have[k])}" for k in sorted(set(have) - set(want))]
             + [f"missing filter {k}={'/'.join(want[k])}" for k in sorted(set(want) - set(have))]
             + [f"different filter {k}={'/'.join(have[k])}, want {'/'.join(want[k])}"
                for k in sorted(set(have) & set(want)) if have[k] != want[k]])
    if not diffs:
      return Verdict(1.0, f"url_match (exact): {pred_url} matches {ref}")
    reasons.append(", ".join(diffs) + (f" (reference {ref})" if len(refs) > 1 else ""))
  return Verdict(0.0, f"url_match (exact): {' | '.join(reasons)} in final URL {site_relative(pred_url)}")


def visited_urls(trajectory: Trajectory) -> list[str]:
  """Every URL the episode showed, in order: each step's page, the page after it, the final page."""
  urls = []
  for step in trajectory.steps:
    urls += [u for u in (step.url, step.info.get("next_url")) if u]
  return urls + [u for u in (final_url(trajectory),) if u]


def visited(spec: dict[str, Any], trajectory: Trajectory) -> Verdict:
  """A subgoal: some page of the episode, not only the last, matches `spec["url"]` under `url_match`'s rules."""
  for url in visited_urls(trajectory):
    if url_match(spec, url).success:
      return Verdict(1.0, f"visited: {site_relative(url)} matches {spec['url']}")
  mode = " (exact)" if spec.get("exact") else ""
  return Verdict(0.0, f"visited{mode}: no page of the episode matches {spec['url']}")


# --------------------------------------------------------------------------------------------- state match


def matches(actual: Any, expected: Any) -> bool:
  """`expected` is a pattern: a dict matches a dict key by key, or a list if any item matches; strings
  compare after strip + lower-case; other values by equality."""
  if isinstance(actual, list) and not isinstance(expected, list):
    return any(matches(a, expected) for a in actual)
  if isinstance(expected, dict):
    return isinstance(actual, dict) and all(k in actual and matches(actual[k], v) for k, v in expected.items())
  return _scalar_equal(actual, expected)


def _scalar_equal(actual: Any, expected: Any) -> bool:
  if isinstance(expected, str) and isinstance(actual, str):
    return actual.strip().lower() == expected.strip().lower()
  if isinstance(actual, bool) or isinstance(expected, bool):  # True must not equal 1
    return actual is expected
  return actual == expected


def equals(actual: Any, expected: Any) -> bool:
  """Like `matches`, but a list must equal a list item by item (no "any item" rule)."""
  if isinstance(expected, list) or isinstance(actual, list):
    return (isinstance(expected, list) and isinstance(actual, list) and len(actual) == len(expected)
            and all(equals(a, e) for a, e in zip(actual, expected)))
  if isinstance(expected, dict):
    return isinstance(actual, dict) and all(k in actual and equals(actual[k], v) for k, v in expected.items())
  return _scalar_equal(actual, expected)


def _lookup(state: dict, path: str) -> tuple[bool, Any]:
  node: Any = state
  for key in path.split("."):
    if not isinstance(node, dict) or key not in node:
      return False, None
    node = node[key]
  return True, node


def state_match(spec: dict[str, Any], state: dict) -> Verdict:
  checks = spec.get("checks")
  if not isinstance(checks, list) or not checks:
    raise ValueError(f"state_match evaluator {spec} needs 'checks': [{{'path': ..., 'contains'|'equals': ...}}]")
  for check in checks:
    found, value = _lookup(state, check["path"])
    if not found:
      return Verdict(0.0, f"state_match: the state has no {check['path']!r}")
    if "equals" in check and not equals(value, check["equals"]):
      return Verdict(0.0, f"state_match: {check['path']} is {value!r}, expected {check['equals']!r}")
    if "contains" in check and not (isinstance(value, list) and matches(value, check["contains"])):
      return Verdict(0.0, f"state_match: no item of {check['path']} matches {check['contains']!r} "
                          f"(it holds {value!r})")
    if "absent" in check and isinstance(value, list) and matches(value, check["absent"]):
      return Verdict(0.0, f"state_match: {check['path']} holds an item matching {check['absent']!r}")
  return Verdict(1.0, f"state_match: {len(checks)} check(s) hold")


def http_state(url: str, timeout: float = 10.0) -> dict:
  return local_http.get(url, timeout).json()


# ------------------------------------------------------------------------------------------------- judge


class ProgrammaticJudge:
  """The `Judge` for tasks with an evaluator spec; `fuzzy` judges fuzzy string matches when given."""

  def __init__(self, fuzzy: FuzzyJudge | None = None, fetch_state: StateFetcher = http_state):
    self.fuzzy = fuzzy
    self.fetch_state = fetch_state

  def evaluate(self, task: Task, trajectory: Trajectory) -> Verdict:
    if not task.evaluator:
      return Verdict(None, f"task {task.id!r} has no evaluator spec; use an LLM judge or the ORM")
    return self.check(task.evaluator, task, trajectory)

  def rubric(self, task: Task, trajectory: Trajectory) -> dict[str, float | None]:
    """Each subgoal of the task's rubric: 1.0, 0.0 or None (cannot be judged here); {} without a rubric. The
    server's state is read once for all of them (the call's own cache: the judge may be shared)."""
    rubric = (task.evaluator or {}).get("rubric") or {}
    cache: dict[str, Any] = {}

    def once(url: str) -> dict:
      if url not in cache:
        try:
          cache[url] = self.fetch_state(url)
        except (httpx.HTTPError, OSError) as e:
          cache[url] = e  # a failed read is not retried by the next subgoal either
      if isinstance(cache[url], Exception):
        raise cache[url]
      return cache[url]

    return {name: self._check(spec, task, trajectory, once).success for name, spec in rubric.items()}

  def check(self, spec: dict[str, Any], task: Task, trajectory: Trajectory) -> Verdict:
    """One spec's verdict; a `"rubric"` key in it is ignored (see `rubric`)."""
    return self._check(spec, task, trajectory, self.fetch_state)

  def _check(self, spec: dict[str, Any], task: Task, trajectory: Trajectory, fetch: StateFetcher) -> Verdict:
    kind = spec.get("kind")
    if kind == "string_match":
      return string_match(spec, final_answer(trajectory), task.intent, self.fuzzy)
    if kind == "url_match":
      return url_match(spec, final_url(trajectory))
    if kind == "visited":
      return visited(spec, trajectory)
    if kind == "state_match":
      url = state_url(task, trajectory)
      if not url:
        return Verdict(0.0, "state_match: no session found (no state_url in meta and no /s/<session>/ URL visited)")
      try:
        state = fetch(url)
      except (httpx.HTTPError, OSError) as e:
        return Verdict(None, f"state_match: could not read {url}: {e}")
      return state_match(spec, state)
    if kind == "program_html":
      return Verdict(None, "program_html needs WebArena's page locators; judge this task with an LLM judge or ORM")
    if kind == "all":
      verdicts = [self._check(s, task, trajectory, fetch) for s in spec["checks"]]
      reason = "; ".join(v.reason for v in verdicts)
      if any(v.success == 0.0 for v in verdicts):
        return Verdict(0.0, reason)
      if any(v.success is None for v in verdicts):
        return Verdict(None, reason)
      score = 1.0
      for v in verdicts:
        score *= v.success
      return Verdict(score, reason)
    if kind == "any":
      verdicts = [self._check(s, task, trajectory, fetch) for s in spec["checks"]]
      reason = " | ".join(v.reason for v in verdicts)
      if any(v.success == 1.0 for v in verdicts):
        return Verdict(1.0, reason)
      return Verdict(None if any(v.success is None for v in verdicts) else 0.0, reason)
    raise ValueError(f"task {task.id!r}: evaluator kind {kind!r} is unknown; use string_match, url_match, "
                     "visited, state_match, program_html, all or any")


def rubric_score(scores: dict[str, float | None]) -> float | None:
  """The share of judged subgoals met (None when there are none)."""
  judged = [v for v in scores.values() if v is not None]
  return sum(judged) / len(judged) if judged else None


def evaluate(task: Task, trajectory: Trajectory, fuzzy: FuzzyJudge | None = None) -> Verdict:
  return ProgrammaticJudge(fuzzy).evaluate(task, trajectory)
