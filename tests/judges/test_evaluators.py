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
