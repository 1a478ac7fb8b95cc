"""Task suites: sizes, splits with disjoint entities, the held-out family, determinism, validation errors."""

import json
import re

import pytest

from jaxagent.envs import sites
from jaxagent.envs.sites import catalog, server, tasks
from jaxagent.types import Task


@pytest.fixture(scope="module")
def suite():
  return tasks.generate(seed=0)


def _entity(task: Task) -> str:
  m = re.search(r"/(p|t)/(\d+)'", json.dumps(task.oracle))
  return f"{m.group(1)}{m.group(2)}" if m else ""


def test_sizes_per_profile(suite):
  for profile in tasks.PROFILES:
    assert sum(t.profile == profile for t in suite["train"]) >= 1000
    assert sum(t.profile == profile for t in suite["test"]) >= 200
  for profile, kinds in (("web", {"string_match", "url_match", "state_match"}),
                         ("device", {"any", "url_match", "state_match"})):
    assert {t.evaluator["kind"] for t in suite["test"] if t.profile == profile} == kinds


def test_splits_have_disjoint_entities_and_a_held_out_family(suite):
  train = {_entity(t) for t in suite["train"]} - {""}
  test = {_entity(t) for t in suite["test"]} - {""}
  assert train and test and not train & test
  train_templates = {t.template for t in suite["train"]}
  for held_out in tasks.HELD_OUT_TEMPLATES:
    assert held_out not in train_templates
    assert any(t.template == held_out for t in suite["test"])


def test_category_sort_train_parts_each_hold_every_category_once(suite):
  """The two halves of the train pairs: disjoint intents, each category once per half with a different sort,
  each sort in both halves; the test pairs in neither."""
  train = [t for t in suite["train"] if t.profile == "device" and t.template == "shop_category_sort"]
  test = {t.intent for t in suite["test"] if t.profile == "device" and t.template == "shop_category_sort"}
  pair = lambda t: re.search(r"/shop/c/(\w+)\?sort=(\w+)", t.evaluator["url"]).groups()
  parts = {p: [pair(t) for t in train if t.meta["part"] == p] for p in ("a", "b")}
  assert len(parts["a"]) == len(parts["b"]) == len(catalog.CATEGORIES)
  for p in ("a", "b"):
    assert sorted(c for c, _ in parts[p]) == sorted(catalog.CATEGORIES)
    assert {s for _, s in parts[p]} == set(tasks.SORT_KEYS)
  assert not set(parts["a"]) & set(parts["b"])
  intents = {p: {t.intent for t in train if t.meta["part"] == p} for p in ("a", "b")}
  assert not intents["a"] & intents["b"] and not (intents["a"] | intents["b"]) & test
  other = [t.meta["part"] for t in suite["train"] if t.template == "shop_price" and t.profile == "web"]
  assert other.count("a") - other.count("b") in (0, 1)  # other families: alternate halves


def test_category_order_latin_square_demonstrates_two_orders_per_category(suite):
  """shop_category_order: part a shows each category with two orders (the order must be read from the intent),
  part b and test one more each; every order in every part; no intent in two parts."""
  pair = lambda t: re.search(r"/shop/c/(\w+)\?sort=(\w+)", t.evaluator["url"]).groups()
  tasks_of = lambda split: [t for t in suite[split] if t.profile == "device" and t.template == "shop_category_order"]
  parts = {p: [pair(t) for t in tasks_of("train") if t.meta["part"] == p] for p in ("a", "b")}
  parts["test"] = [pair(t) for t in tasks_of("test")]
  cats = sorted(catalog.CATEGORIES)
  assert sorted(c for c, _ in parts["a"]) == sorted(cats * 2)
  for p in ("b", "test"):
    assert sorted(c for c, _ in parts[p]) == cats
  for p in parts:
    assert {s for _, s in parts[p]} == set(tasks.ORDER_KEYS)
  assert len(set(parts["a"]) | set(parts["b"]) | set(parts["test"])) == len(cats) * len(tasks.ORDER_KEYS)
  intents = [{t.intent for t in tasks_of("train") if t.meta["part"] == p} for p in ("a", "b")]
  intents.append({t.intent for t in tasks_of("test")})
  assert not intents[0] & intents[1] and not (intents[0] | intents[1]) & intents[2]


def test_generation_is_deterministic_and_ids_unique(suite):
  again = tasks.generate(seed=0)
  assert [t.to_json() for t in again["test"]] == [t.to_json() for t in suite["test"]]
  ids = [t.id for split in suite.values() for t in split]
  assert len(ids) == len(set(ids))
  assert tasks.generate(seed=1, profiles=("web",))["test"][0].intent != suite["test"][0].intent


def test_answers_agree_with_the_world(suite):
  world = catalog.build_world(0)
  for t in suite["test"]:
    if t.template == "shop_price":
      pid = int(_entity(t)[1:])
      check = t.evaluator if t.profile != "device" else t.evaluator["checks"][0]
      assert check["must_include"] == [world.product(pid).price]
      if t.profile == "device":
        assert t.evaluator["checks"][1] == {"kind": "url_match", "url": f"/shop/p/{pid}"}
      assert t.oracle[-1] == {"op": "answer", "text": world.product(pid).price}
    if t.template == "forum_replies" and t.profile == "text":
      assert t.evaluator["exact_match"] == str(world.thread(int(_entity(t)[1:])).replies)


def test_device_tasks_start_on_the_launcher(suite):
  dev = [t for t in suite["test"] if t.profile == "device"]
  assert all(t.start_url == "__SITES__/launcher/" and t.oracle[0]["selector"].startswith("#app-") for t in dev)
  assert all(t.meta["home_url"] == "__SITES__/launcher/" for t in dev)


def test_write_and_load_round_trip(tmp_path, suite):
  paths = tasks.write_suite(str(tmp_path), suite=suite)
  loaded = sites.load_tasks(paths["device_test"])
  assert [t.to_json() for t in loaded] == [t.to_json() for t in suite["test"] if t.profile == "device"]


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("intent"), "'intent'"),
    (lambda d: d.update(profile="tablet"), "'profile'"),
    (lambda d: d.update(site="bank"), "'site'"),
    (lambda d: d.update(evaluator={"kind": "vibes"}), "'evaluator.kind'"),
    (lambda d: d.update(oracle=[{"op": "click"}]), "'oracle[0].selector'"),
    (lambda d: d.update(colour="red"), "unknown field(s) ['colour']"),
    (lambda d: d.update(start_url="http://example.com/"), "'start_url'"),
])
def test_malformed_task_file_names_line_and_field(tmp_path, suite, mutate, field):
  good = suite["test"][0].to_json()
  bad = dict(good, id="bad")
  mutate(bad)
  path = tmp_path / "tasks.jsonl"
  path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
  with pytest.raises(tasks.TaskFileError) as e:
    sites.load_tasks(str(path))
  assert f"{path}:3:" in str(e.value) and field in str(e.value)


def test_bad_json_and_duplicate_ids_are_named(tmp_path, suite):
  good = json.dumps(suite["test"][0].to_json())
  path = tmp_path / "t.jsonl"
  path.write_text(good + "\n{not json\n")
  with pytest.raises(tasks.TaskFileError, match=r":2: "):
    sites.load_tasks(str(path))
  path.write_text(good + "\n" + good + "\n")
  with pytest.raises(tasks.TaskFileError, match=r":2: field 'id'"):
    sites.load_tasks(str(path))


def test_unknown_site_fails_before_any_server_or_browser():
  task = Task(id="x", intent="do it", site="bank", start_url="__SITES__/bank/")
  server.stop_server()
  with pytest.raises(ValueError, match="field 'site' is 'bank'"):
    sites.episode_task(task)
  assert server._server is None  # nothing was started


def test_episode_task_binds_a_session(suite):
  t = next(t for t in suite["test"] if t.profile == "device")
  with server.SiteServer(seed=t.seed) as served:  # binding asks the server which world it serves
    url = served.base_url
    bound = sites.episode_task(t, base_url=url, session="ep1")
    assert bound.start_url == f"{url}/s/ep1/launcher/"
    assert bound.meta["home_url"] == f"{url}/s/ep1/launcher/"
    assert bound.meta["state_url"] == f"{url}/__state__/ep1"
    assert bound.allowed_origins == (url,)
    other = sites.episode_task(t, base_url=url)
    assert other.meta["session"] != "ep1"


def test_select_filters_families_caps_steps_and_names_the_choices():
  chosen = sites.select(0, "device", "forum_author, forum_replies", max_steps=3)
  assert chosen["train"] and chosen["test"]
  for split in ("train", "test"):
    assert {t.template for t in chosen[split]} <= {"forum_author", "forum_replies"}
    assert all(t.profile == "device" and t.max_steps <= 3 for t in chosen[split])
  assert len(sites.select(0, "web")["test"]) == len(sites.generate(0, profiles=("web",))["test"])
  with pytest.raises(ValueError, match="choose among"):
    sites.select(0, "web", "no_such_family")
