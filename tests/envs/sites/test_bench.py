"""The sites benchmark: families, tiers, splits disjoint by parameter tuple, sizes, generation time, split specs."""

import collections
import json
import time
import types

import pytest

from jaxagent.envs.sites import bench, catalog, tasks

SEED = 0


@pytest.fixture(scope="module")
def world():
  return catalog.build_world(SEED)


@pytest.fixture(scope="module")
def pools(world):
  return bench.intents(world)


@pytest.fixture(scope="module")
def device_suite():
  return bench.generate(SEED, "device", 2)


@pytest.mark.slow
def test_sizes_meet_the_design(pools, device_suite):
  assert len(bench.FAMILIES) >= 8
  train = [it for s in bench.TRAIN_SPLITS for it in pools[s]]
  assert len({it.key for it in train}) >= 5000
  head = bench.headline(device_suite)
  assert len({t.meta["intent_id"] for t in head}) == len(head) >= 200
  for profile in ("web", "text"):
    assert len(bench.headline(bench.generate(SEED, profile, 0, splits=bench.HEADLINE))) >= 200
  for split in bench.TEST_SPLITS:
    assert device_suite[split], split


@pytest.mark.slow
def test_splits_are_disjoint_in_intents_values_and_templates(pools):
  keys = {s: {it.key for it in its} for s, its in pools.items()}
  splits = list(keys)
  for i, a in enumerate(splits):
    for b in splits[i + 1:]:
      assert not keys[a] & keys[b], (a, b)
  train = [it for s in bench.TRAIN_SPLITS for it in pools[s]]
  train_values = {v for it in train for _, v in it.params}
  for brand in bench.HELD_OUT_BRANDS:
    assert brand not in train_values
  for it in train:
    params = dict(it.params)
    for key in ("product", "thread"):
      if key in params:
        assert params[key] % 5 != 0, it
    assert it.template not in ("lookup_reviews", "cross_reviews")
  assert {it.template for it in pools["test_template"]} == {"lookup_reviews", "cross_reviews"}
  # a held-out combination: each of its values occurs in a train intent of its family, as the same parameter
  # (docs/benchmark.md's "every value seen"), the combination does not
  seen = {(it.family, name, v) for it in train for name, v in it.params}
  for it in pools["test_comb"]:
    assert all((it.family, name, v) in seen for name, v in it.params), it
    assert it.key not in keys["train_a"] | keys["train_b"] | keys["train_c"], it


def test_cross_holds_out_a_pairing_of_a_train_product_and_a_train_thread(pools, world):
  """`cross`'s test_comb: each product and thread of a train intent, on a (category, board) pairing no train
  intent of the family holds."""
  pairing = lambda it: (world.product(it.get("product")).category, world.thread(it.get("thread")).board)
  train = [it for s in bench.TRAIN_SPLITS for it in pools[s] if it.family == "cross"]
  held = [it for it in pools["test_comb"] if it.family == "cross"]
  assert len(held) >= bench.TEST_SIZES["test_comb"] and len({it.get("product") for it in held}) == len(held)
  assert {pairing(it) for it in held} and not {pairing(it) for it in held} & {pairing(it) for it in train}
  assert {it.get("product") for it in held} <= {it.get("product") for it in train}


def test_combination_split_holds_out_pairings(pools):
  """filter's test_comb (category, order) pairings of single-filter intents never occur in train with that filter."""
  train = {(dict(it.params)["category"], dict(it.params)["order"]) for s in bench.TRAIN_SPLITS for it in pools[s]
           if it.family == "filter" and not dict(it.params)["colour"]}
  held = {(dict(it.params)["category"], dict(it.params)["order"]) for it in pools["test_comb"]
          if it.family == "filter" and not dict(it.params)["colour"]}
  assert held and not held & train


def test_control_is_todays_family_unchanged(device_suite, world):
  old = tasks.generate(SEED, profiles=("device",))
  old_intents = {t.intent for s in old.values() for t in s if t.template == "shop_category_order"}
  control = [t for s in device_suite.values() for t in s if t.meta["family"] == bench.CONTROL]
  assert {t.intent for t in control} == old_intents
  for t in control:
    assert "perturb" not in t.meta and t.max_steps == bench.CONTROL_CAPS["device"]
    assert t.evaluator["kind"] == "url_match" and not t.evaluator.get("exact")
  parts = collections.Counter(t.split for t in control)
  assert parts == {"train_a": 16, "train_b": 8, "test_comb": 8}


def test_tiers_caps_and_rubrics(device_suite):
  seen_tiers = collections.defaultdict(set)
  for split, ts in device_suite.items():
    for t in ts:
      seen_tiers[t.meta["family"]].add(t.meta["tier"])
      lo, hi = {1: (2, 5), 2: (6, 10), 3: (11, 18)}[t.meta["tier"]]
      assert lo <= t.meta["expert_steps"] <= hi, t.id
      if t.meta["family"] != bench.CONTROL:
        assert t.max_steps == bench.cap(t.meta["expert_steps"], "device")
        assert t.evaluator.get("rubric"), t.id
  assert seen_tiers["buy"] == {3} and seen_tiers["cross"] == {3}
  assert 1 in seen_tiers["filter"] and 2 in seen_tiers["filter"]


def test_exact_judges_where_detours_must_cost(device_suite):
  by_family = {t.meta["family"]: t for t in device_suite["test_comb"]}
  assert by_family["filter"].evaluator["exact"] is True
  assert by_family["cart"].evaluator["checks"][0]["equals"]
  assert by_family["buy"].evaluator["checks"][0]["path"] == "orders"
  assert by_family["reply"].evaluator["checks"][0]["equals"]


def test_perturbation_specs(device_suite):
  for t in device_suite["test_layout"]:
    if t.meta["family"] != bench.CONTROL:
      assert t.meta["perturb"]["layout"] == "test"
  for t in device_suite["test_comb"]:
    if t.meta["family"] != bench.CONTROL:
      assert t.meta["perturb"] == {**t.meta["perturb"], "level": 2, "layout": "train"}
  assert all("perturb" not in t.meta for t in bench.generate(SEED, "device", 0, splits=("test_comb",))["test_comb"])


def test_iid_split_repeats_train_intents_with_new_episode_ids(device_suite):
  train_ids = {t.meta["intent_id"] for s in bench.TRAIN_SPLITS for t in device_suite[s]}
  for t in device_suite["test_iid"]:
    assert t.meta["intent_id"] in train_ids and t.id.endswith("@iid")


def test_every_task_validates(device_suite):
  for ts in device_suite.values():
    for t in ts[:200]:
      tasks.validate(t)


@pytest.mark.slow
def test_generating_every_split_is_fast():
  """In this process's CPU time: the suite's other workers share the cores, and wall time would count them."""
  start = time.process_time()
  for profile in bench.PROFILES:
    bench.generate(SEED, profile, 2)
  assert time.process_time() - start <= 10.0


@pytest.mark.parametrize("spec, error", [
    ("device", "PROFILE/SPLIT"), ("phone/test_comb", "profile 'phone'"), ("device/test", "split 'test'"),
    ("device/test_comb@3", "level '3'"), ("device/test_comb/shoes", "family 'shoes'")])
def test_bad_split_specs_are_refused_naming_the_part(spec, error):
  with pytest.raises(ValueError, match=error):
    bench.parse_split(spec)


def test_split_specs():
  assert bench.parse_split("web/headline@1/filter,cart") == ("web", "headline", 1, ("filter", "cart"))
  head = bench.tasks_for("web/headline/filter", SEED)
  assert head and {t.meta["family"] for t in head} == {"filter"}


@pytest.mark.slow
def test_the_control_split_is_the_recipes_negative_control_apart_from_the_headline():
  from jaxagent.pipeline import tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  control = bench.tasks_for("text/control@2", SEED)
  assert control and {t.meta["family"] for t in control} == {bench.CONTROL}
  assert not {t.meta["intent_id"] for t in control} & {t.meta["intent_id"] for t in
                                                       bench.tasks_for("text/headline@2", SEED)}
  config = types.SimpleNamespace(tasks=types.SimpleNamespace(seed=SEED, templates="", level=2))
  assert [t.to_json() for t in control] == [t.to_json() for t in tasks_lib.bench_splits(config, "text")["control"]]


def test_a_malformed_benchmark_file_is_refused_naming_file_line_and_field(tmp_path):
  path = tmp_path / "device_headline_L2.jsonl"
  bench.write_split(str(tmp_path), "device/headline@2/filter", SEED)
  lines = path.read_text().splitlines()
  assert len(tasks.load_tasks(str(path))) == len(lines)
  bad = json.loads(lines[1])
  bad["meta"]["perturb"]["level"] = 5
  path.write_text("\n".join([lines[0], json.dumps(bad)] + lines[2:]) + "\n")
  with pytest.raises(tasks.TaskFileError, match=r"device_headline_L2.jsonl:2: field 'meta.perturb'.*perturb.level"):
    tasks.load_tasks(str(path))
