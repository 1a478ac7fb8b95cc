"""`config.tasks.suite=bench`: a recipe's `tasks` stage writes the sites benchmark's splits (the train parts, the
headline as `test`, the negative control apart), disjoint in intents, and a bad suite, level or family is refused
before any work, naming the key."""

import os

import ml_collections
import pytest

from configs import digirl as digirl_config
from jaxagent.pipeline import tasks as tasks_lib
from jaxagent.pipeline.config import ConfigError, validate
from jaxagent.recipes import digirl


def _config(**tasks):
  return ml_collections.ConfigDict({"tasks": {"seed": 0, "templates": "", "max_steps": 6, "suite": "bench",
                                              "level": 2, **tasks}})


@pytest.mark.slow
def test_the_bench_suite_writes_train_parts_the_headline_and_the_control(tmp_path):
  counts = tasks_lib.stage_tasks(_config(), str(tmp_path), "device")
  assert counts["test"] == 270 and counts["control"] == 8  # docs/benchmark.md: 270 headline intents on the phone
  assert counts["train"] == counts["train_a"] + counts["train_b"] + counts["train_c"]
  split = {name: tasks_lib.read_tasks(os.path.join(tmp_path, f"{name}.jsonl"))
           for name in ("train_a", "train_b", "train_c", "test", "control")}
  intents = {name: {t.meta["intent_id"] for t in ts} for name, ts in split.items()}
  assert not intents["test"] & (intents["train_a"] | intents["train_b"] | intents["train_c"])
  assert not intents["train_a"] & intents["train_b"] and not intents["train_b"] & intents["train_c"]
  assert {t.meta["family"] for t in split["control"]} == {"order"} and "order" not in {
      t.meta["family"] for t in split["test"]}
  assert {t.split for t in split["test"]} == {"test_comb", "test_value", "test_template"}
  assert max(t.max_steps for t in split["test"]) > 6  # each family's own cap, not tasks.max_steps
  assert all(t.meta["perturb"]["level"] == 2 for t in split["test"])


@pytest.mark.slow
def test_templates_name_the_benchmark_families(tmp_path):
  counts = tasks_lib.stage_tasks(_config(templates="cart,order", level=0), str(tmp_path), "text")
  test = tasks_lib.read_tasks(os.path.join(tmp_path, "test.jsonl"))
  assert {t.meta["family"] for t in test} == {"cart"} and counts["control"] == 8
  assert all("perturb" not in t.meta for t in test)  # level 0: today's pages


@pytest.mark.parametrize("tasks,needle", [
    (dict(suite="benchmark"), r"config\.tasks\.suite='benchmark' is not one of \('sites', 'bench'\)"),
    (dict(level=3), r"config\.tasks\.level=3 is not a perturbation level of the benchmark"),
    (dict(templates="shop_category_sort"), r"config\.tasks\.templates='shop_category_sort': \['shop_category_sort'\] "
                                           r"are not benchmark families"),
])
def test_a_bad_suite_level_or_family_is_refused_before_any_work_naming_the_key(tasks, needle):
  config = digirl_config.get_config("smoke")
  config.tasks.update({"suite": "bench", "templates": "", **tasks})
  with pytest.raises(ConfigError, match=needle):
    validate(config, digirl.CHOICES, {})


def test_the_default_suite_is_the_sites_and_bench_validates():
  config = digirl_config.get_config("")
  assert config.tasks.suite == "sites"
  config.tasks.update(suite="bench", templates="filter,cart")
  validate(config, digirl.CHOICES, {})


@pytest.mark.slow
def test_the_evaluation_plays_every_headline_and_control_intent_once(tmp_path):
  config = _config(templates="cart,order")
  config.eval = {"episodes": 0, "seed": 1}
  tasks_lib.stage_tasks(config, str(tmp_path / "tasks"), "device")
  test, control = tasks_lib.test_episodes(config, str(tmp_path)), tasks_lib.control_episodes(config, str(tmp_path))
  headline = tasks_lib.read_tasks(str(tmp_path / "tasks" / "test.jsonl"))
  assert sorted(t.id.split("@")[0] for t in test) == sorted(t.id for t in headline)  # each once
  assert len(control) == 8 and len({t.id for t in control}) == 8
  config.tasks.suite = "sites"
  assert tasks_lib.control_episodes(config, str(tmp_path)) == []
