"""Evaluators on hand-made positive and negative trajectories, one kind at a time, against a real site server."""

import httpx
import pytest

from jaxagent.envs.sites import catalog, server
from jaxagent.judges import evaluators
from jaxagent.types import Action, ActionKind, Step, Task, Trajectory


def _task(evaluator, **kw):
  return Task(id="t", intent="q?", site="shop", start_url="__SITES__/shop/", evaluator=evaluator, **kw)


def _traj(task, answer=None, urls=(), meta=None):
  steps = [Step(step=k, url=u, action=Action(ActionKind.CLICK, element=1)) for k, u in enumerate(urls)]
  if answer is not None:
    steps.append(Step(step=len(steps), url=urls[-1] if urls else "", action=Action(ActionKind.ANSWER, text=answer)))
  return Trajectory(task=task, steps=steps, meta=meta or {})


@pytest.mark.parametrize("spec, answer, ok", [
    ({"exact_match": "alex_k"}, "alex_k", 1.0),
    ({"exact_match": "alex_k"}, '  "Alex_K" ', 1.0),  # WebArena's clean_answer: strip, unquote, lower
    ({"exact_match": "12"}, "123", 0.0),
    ({"exact_match": "12"}, "", 0.0),
    ({"must_include": ["$12.99"]}, "It costs $12.99.", 1.0),
    ({"must_include": ["$12.99"]}, "It costs $112.95", 0.0),
    ({"must_include": ["Catso", "Dibbins"]}, "catso and dibbins", 1.0),
    ({"must_include": ["Catso", "Dibbins"]}, "only Catso", 0.0),
])
def test_string_match(spec, answer, ok):
  task = _task({"kind": "string_match", **spec})
  v = evaluators.evaluate(task, _traj(task, answer))
  assert v.success == ok, v.reason


def test_answer_comes_from_the_trajectory_field_first():
  task = _task({"kind": "string_match", "exact_match": "4"})
  traj = _traj(task, "5")
  traj.answer = "4"
  assert evaluators.evaluate(task, traj).success == 1.0


def test_fuzzy_match_uses_the_judge_or_stays_unjudged():
  task = _task({"kind": "string_match", "fuzzy_match": ["about thirty thousand"]})
  traj = _traj(task, "30k stars")
  v = evaluators.evaluate(task, traj)
  assert v.success is None and "needs a judge" in v.reason
  calls = []

  def judge(intent, ref, pred):
    calls.append((intent, ref, pred))
    return 1.0 if "30k" in pred else 0.0

  assert evaluators.evaluate(task, traj, fuzzy=judge).success == 1.0
  assert calls == [("q?", "about thirty thousand", "30k stars")]
  assert evaluators.evaluate(task, _traj(task, "no idea"), fuzzy=judge).success == 0.0


@pytest.mark.parametrize("ref, final, ok", [
    ("/shop/c/audio?sort=rating", "http://127.0.0.1:5/s/ep/shop/c/audio?sort=rating", 1.0),
    ("/shop/c/audio?sort=rating", "http://127.0.0.1:5/s/ep/shop/c/audio/?page=2&sort=rating", 1.0),
    ("/shop/c/audio?sort=rating", "http://127.0.0.1:5/s/ep/shop/c/audio?sort=price_asc", 0.0),
    ("/shop/c/audio?sort=rating", "http://127.0.0.1:5/s/ep/shop/c/audio", 0.0),
    ("/shop/c/audio", "http://127.0.0.1:5/s/ep/shop/c/audio-x", 0.0),
    ("/forum/u/alex", "http://127.0.0.1:5/s/ep/forum/u/alex", 1.0),
    ("/forum/u/bea |OR| /forum/u/alex", "http://127.0.0.1:5/s/ep/forum/u/alex", 1.0),
    ("http://localhost:7770/review", "http://localhost:7770/review/?id=3", 1.0),  # WebArena: GOLD in PRED
    ("http://localhost:7770/review", "http://localhost:7770/orders", 0.0),
])
def test_url_match(ref, final, ok):
  task = _task({"kind": "url_match", "url": ref})
  v = evaluators.evaluate(task, _traj(task, "", urls=["http://127.0.0.1:5/s/ep/shop/", final]))
  assert v.success == ok, v.reason


def test_url_match_prefers_the_collectors_final_url():
  task = _task({"kind": "url_match", "url": "/shop/cart"})
  traj = _traj(task, "", urls=["http://h/s/e/shop/"], meta={"final_url": "http://h/s/e/shop/cart"})
  assert evaluators.evaluate(task, traj).success == 1.0
  assert evaluators.evaluate(task, _traj(task, "")).success == 0.0  # no URL at all


@pytest.fixture(scope="module")
def site():
  with server.SiteServer() as s:
    yield s.base_url


def test_state_match_against_the_server(site):
  p = next(p for p in catalog.build_world(0).products if "M" in p.sizes)
  with httpx.Client(base_url=site) as c:
    c.post("/s/good/shop/cart/add", data={"product_id": p.id, "colour": "", "size": "M"})
    c.post("/s/good/forum/t/7/reply", data={"body": "Thanks for sharing this!"})
    c.post("/s/good/settings/toggle/bluetooth")
    cart = server.fetch_state(site, "good")["cart"][0]
  spec = {"kind": "state_match", "checks": [
      {"path": "cart", "contains": {"product_id": p.id, "colour": cart["colour"], "size": "M"}},
      {"path": "replies", "contains": {"thread_id": 7, "body": "thanks for sharing this!"}},
      {"path": "settings.bluetooth", "equals": True}]}
  task = _task(spec)
  # the session is read from the trajectory's URLs ...
  good = _traj(task, "", urls=[f"{site}/s/good/shop/", f"{site}/s/good/forum/t/7"])
  v = evaluators.evaluate(task, good)
  assert v.success == 1.0, v.reason
  # ... or from the bound task's meta
  bound = server.episode_task(task, base_url=site, session="good")
  assert evaluators.evaluate(bound, _traj(bound, "")).success == 1.0
  # a fresh session has none of it
  v = evaluators.evaluate(task, _traj(task, "", urls=[f"{site}/s/other/shop/"]))
  assert v.success == 0.0 and "cart" in v.reason
  # one wrong field fails the check
  wrong = _task({"kind": "state_match", "checks": [{"path": "cart", "contains": {"product_id": p.id + 1}}]})
  assert evaluators.evaluate(wrong, good).success == 0.0
  off = _task({"kind": "state_match", "checks": [{"path": "settings.bluetooth", "equals": 1}]})
  assert evaluators.evaluate(off, good).success == 0.0  # True is not 1
  missing = _task({"kind": "state_match", "checks": [{"path": "settings.nfc", "equals": True}]})
  assert "no 'settings.nfc'" in evaluators.evaluate(missing, good).reason


def test_state_match_without_session_or_server():
  task = _task({"kind": "state_match", "checks": [{"path": "cart", "contains": {}}]})
  assert evaluators.evaluate(task, _traj(task, "")).success == 0.0
  dead = _traj(task, "", urls=["http://127.0.0.1:9/s/x/shop/"])  # port 9: nothing listens
  v = evaluators.evaluate(task, dead)
  assert v.success is None and "could not read" in v.reason


def test_nested_order_match():
  state = {"orders": [{"name": "Ada Lovelace", "items": [{"product_id": 1, "size": ""}, {"product_id": 9, "size": "M"}]}]}
  ok = {"checks": [{"path": "orders", "contains": {"name": "ada lovelace", "items": {"product_id": 9, "size": "M"}}}]}
  bad = {"checks": [{"path": "orders", "contains": {"name": "ada lovelace", "items": {"product_id": 9, "size": "S"}}}]}
  assert evaluators.state_match(ok, state).success == 1.0
  assert evaluators.state_match(bad, state).success == 0.0


def test_combination_multiplies():
  spec = {"kind": "all", "checks": [{"kind": "string_match", "must_include": ["42"]},
                                    {"kind": "url_match", "url": "/shop/cart"}]}
  task = _task(spec)
  both = _traj(task, "42", urls=["http://h/s/e/shop/cart"])
  one = _traj(task, "42", urls=["http://h/s/e/shop/"])
  assert evaluators.evaluate(task, both).success == 1.0
  v = evaluators.evaluate(task, one)
  assert v.success == 0.0 and "url_match" in v.reason
  html = _task({"kind": "all", "checks": [{"kind": "string_match", "must_include": ["42"]},
                                          {"kind": "program_html", "program_html": []}]})
  assert evaluators.evaluate(html, both).success is None


def test_any_needs_one_passing_check():
  spec = {"kind": "any", "checks": [{"kind": "string_match", "exact_match": "3"},
                                    {"kind": "url_match", "url": "/forum/t/5"}]}
  task = _task(spec)
  assert evaluators.evaluate(task, _traj(task, "3", urls=["http://h/s/e/forum/"])).success == 1.0
  assert evaluators.evaluate(task, _traj(task, "", urls=["http://h/s/e/forum/t/5"])).success == 1.0
  v = evaluators.evaluate(task, _traj(task, "4", urls=["http://h/s/e/forum/t/6"]))
  assert v.success == 0.0 and "exact_match" in v.reason and "url_match" in v.reason


def test_no_spec_and_unknown_kind():
  assert evaluators.evaluate(_task({}), Trajectory(task=_task({}))).success is None
  with pytest.raises(ValueError, match="kind 'vibes'"):
    evaluators.evaluate(_task({"kind": "vibes"}), Trajectory(task=_task({})))


# ------------------------------------------------------------------------------- exact URLs, visited, rubric

S = "http://127.0.0.1:5/s/ep"


@pytest.mark.parametrize("spec, final, ok, why", [
    ({"url": "/shop/c/audio?sort=rating"}, "/shop/c/audio?sort=rating", 1.0, ""),
    ({"url": "/shop/c/audio?sort=rating"}, "/shop/c/audio/?sort=rating&page=3", 1.0, ""),  # page ignored by default
    ({"url": "/shop/c/audio?sort=rating"}, "/shop/c/audio?sort=rating&brand=Acorn", 0.0, "extra filter brand=Acorn"),
    ({"url": "/shop/c/audio?sort=rating&brand=Acorn"}, "/shop/c/audio?brand=Acorn", 0.0, "missing filter sort=rating"),
    ({"url": "/shop/c/audio?brand=Acorn"}, "/shop/c/audio?brand=Birch", 0.0,
     "different filter brand=Birch, want Acorn"),
    ({"url": "/shop/c/audio?brand=Pine%20wood"}, "/shop/c/audio?brand=Pine wood", 1.0, ""),  # decoded both sides
    ({"url": "/shop/c/audio?brand=Pine wood"}, "/shop/c/audio?brand=Pine+wood", 1.0, ""),
    ({"url": "/shop/c/audio?brand=Pine%20wood"}, "/shop/c/audio?brand=Pine", 0.0, "brand=Pine, want Pine wood"),
    ({"url": "/shop/c/audio", "ignore": ["sort"]}, "/shop/c/audio?sort=rating", 1.0, ""),
    ({"url": "/shop/c/audio", "ignore": ["sort"]}, "/shop/c/audio?sort=rating&page=2", 0.0, "extra filter page=2"),
    ({"url": "/shop/c/audio?sort=rating"}, "/shop/c/books?sort=rating", 0.0, "path /shop/c/books"),
    ({"url": "/shop/c/audio?brand=Birch |OR| /shop/c/audio?brand=Acorn"}, "/shop/c/audio?brand=Acorn", 1.0, ""),
    ({"url": "/shop/c/audio?brand=Birch |OR| /shop/c/audio"}, "/shop/c/audio?brand=Acorn", 0.0, "extra filter"),
])
def test_url_match_exact(spec, final, ok, why):
  task = _task({"kind": "url_match", "exact": True, **spec})
  v = evaluators.evaluate(task, _traj(task, "", urls=[f"{S}/shop/", S + final]))
  assert v.success == ok and why in v.reason and "url_match (exact)" in v.reason, v.reason


@pytest.mark.parametrize("final", ["/shop/c/audio?sort=rating&brand=Acorn", "/shop/c/audio?sort=rating&page=2"])
def test_url_match_default_stays_gold_in_pred(final):
  task = _task({"kind": "url_match", "url": "/shop/c/audio?sort=rating"})  # no "exact": extras are fine
  assert evaluators.evaluate(task, _traj(task, "", urls=[S + final])).success == 1.0


def test_visited_any_page_of_the_episode():
  traj = _traj(_task({}), "", urls=[f"{S}/shop/", f"{S}/shop/p/12", f"{S}/shop/cart"])
  judge = evaluators.ProgrammaticJudge()
  v = judge.check({"kind": "visited", "url": "/shop/p/12"}, traj.task, traj)  # only in the middle
  assert v.success == 1.0 and "/shop/p/12" in v.reason, v.reason
  v = judge.check({"kind": "visited", "url": "/shop/p/13"}, traj.task, traj)
  assert v.success == 0.0 and "no page" in v.reason, v.reason
  assert judge.check({"kind": "url_match", "url": "/shop/p/12"}, traj.task, traj).success == 0.0  # not the last
  # the page a step led to (env info) and the final page count too
  traj.steps[0].info["next_url"] = f"{S}/shop/c/audio?sort=rating"
  traj.meta["final_url"] = f"{S}/shop/checkout"
  for url in ("/shop/c/audio?sort=rating", "/shop/checkout"):
    assert judge.check({"kind": "visited", "url": url}, traj.task, traj).success == 1.0, url
  assert judge.check({"kind": "visited", "url": "/shop/p/12"}, traj.task, _traj(_task({}), "")).success == 0.0


def test_visited_exact():
  traj = _traj(_task({}), "", urls=[f"{S}/shop/c/audio?brand=Acorn&sort=rating", f"{S}/shop/cart"])
  judge = evaluators.ProgrammaticJudge()
  loose = {"kind": "visited", "url": "/shop/c/audio?sort=rating"}
  assert judge.check(loose, traj.task, traj).success == 1.0
  v = judge.check({**loose, "exact": True}, traj.task, traj)
  assert v.success == 0.0 and "visited (exact)" in v.reason, v.reason
  traj.steps.insert(1, Step(step=1, url=f"{S}/shop/c/audio?sort=rating&page=2"))
  assert judge.check({**loose, "exact": True}, traj.task, traj).success == 1.0


def test_visited_is_a_task_evaluator_kind():
  from jaxagent.envs.sites import tasks  # pylint: disable=g-import-not-at-top
  assert "visited" in tasks.EVALUATOR_KINDS


RUBRIC_TASK = {"kind": "url_match", "url": "/shop/checkout", "rubric": {
    "found_product": {"kind": "visited", "url": "/shop/p/12"},
    "in_cart": {"kind": "state_match", "checks": [{"path": "cart", "contains": {"product_id": 12}}]},
    "chose_size": {"kind": "state_match", "checks": [{"path": "cart", "contains": {"size": "M"}}]},
    "answered": {"kind": "string_match", "fuzzy_match": ["done"]},  # no fuzzy judge: None
    "sorted": {"kind": "all", "checks": [
        {"kind": "visited", "url": "/shop/c/audio?sort=rating"},
        {"kind": "state_match", "checks": [{"path": "cart", "equals": []}]}]},
}}


def _fetcher(state):
  calls = []

  def fetch(url):
    calls.append(url)
    return state
  return fetch, calls


def test_rubric_scores_each_subgoal_and_reads_the_state_once():
  task = _task(RUBRIC_TASK)
  traj = _traj(task, "", urls=[f"{S}/shop/", f"{S}/shop/p/12", f"{S}/shop/cart"])
  fetch, calls = _fetcher({"cart": [{"product_id": 12, "size": "S"}]})
  judge = evaluators.ProgrammaticJudge(fetch_state=fetch)
  scores = judge.rubric(task, traj)
  assert scores == {"found_product": 1.0, "in_cart": 1.0, "chose_size": 0.0, "answered": None, "sorted": 0.0}
  assert list(scores) == list(RUBRIC_TASK["rubric"])  # the spec's order
  assert calls == [f"{S.replace('/s/ep', '')}/__state__/ep"]  # three state checks, one read
  judge.rubric(task, traj)
  assert len(calls) == 2  # the cache lives for one call only
  assert evaluators.rubric_score(scores) == pytest.approx(2 / 4)


def test_rubric_never_changes_the_verdict():
  task = _task(RUBRIC_TASK)
  fetch, calls = _fetcher({"cart": [{"product_id": 12, "size": "M"}]})
  judge = evaluators.ProgrammaticJudge(fetch_state=fetch)
  unfinished = _traj(task, "", urls=[f"{S}/shop/p/12", f"{S}/shop/cart"])
  assert judge.rubric(task, unfinished)["in_cart"] == 1.0
  v = judge.evaluate(task, unfinished)  # subgoals met, the task not
  assert v.success == 0.0 and "url_match" in v.reason and "visited" not in v.reason, v.reason
  finished = _traj(task, "", urls=[f"{S}/shop/checkout"])
  assert judge.rubric(task, finished)["found_product"] == 0.0
  assert judge.evaluate(task, finished).success == 1.0  # subgoals missed, the task done
  assert judge.evaluate(_task({k: v for k, v in RUBRIC_TASK.items() if k != "rubric"}), finished).success == 1.0
  assert len(calls) == 2  # only the rubrics read the state


def test_rubric_without_one_and_unreadable_state():
  task = _task({"kind": "url_match", "url": "/shop/cart"})
  traj = _traj(task, "", urls=[f"{S}/shop/cart"])
  assert evaluators.ProgrammaticJudge().rubric(task, traj) == {}
  assert evaluators.rubric_score({}) is None and evaluators.rubric_score({"a": None}) is None
  assert evaluators.rubric_score({"a": 1.0, "b": 0.0, "c": None, "d": 1.0}) == pytest.approx(2 / 3)
  calls = []

  def down(url):
    calls.append(url)
    raise httpx.ConnectError("refused")

  task = _task(RUBRIC_TASK)
  scores = evaluators.ProgrammaticJudge(fetch_state=down).rubric(task, _traj(task, "", urls=[f"{S}/shop/p/12"]))
  assert scores["found_product"] == 1.0 and scores["in_cart"] is None and scores["chose_size"] is None
  assert len(calls) == 1  # a failed read is not retried within the call
