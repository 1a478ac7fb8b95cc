"""The ORM retraining tool's hindsight relabelling and config overrides, on hand-built tasks and episodes."""

import ml_collections
import pytest

from data_tools import webrl_orm_retrain as tool
from jaxagent.types import Task, Trajectory


def _task(name, url, template="shop_category_order", kind="url_match"):
  evaluator = {"kind": kind, "url": url} if kind == "url_match" else {"kind": kind, "checks": []}
  return Task(id=name, intent=f"list {name}", site="shop", start_url="u", template=template, evaluator=evaluator)


def test_relabel_keeps_the_siblings_the_final_page_passes_and_n_it_fails():
  own = _task("a", "/shop/c/a?sort=price")
  pool = [own, _task("b", "/shop/c/b?sort=rating"), _task("c", "/shop/c/c?sort=price"),
          _task("d", "/shop/c/d?sort=price"), _task("e", "/shop/c/b?sort=rating", template="other"),
          _task("f", "", kind="state_match")]
  episode = Trajectory(own, [], success=0.0, meta={"final_url": "http://h/s/x/shop/c/b?sort=rating"})
  pairs = tool.relabel([episode], pool, negatives=1, seed=0)
  assert [(t.task.id, ok, t.success) for t, ok in pairs][0] == ("b", True, 1.0)  # the goal it reached
  assert len(pairs) == 2 and pairs[1][0].task.id in ("c", "d") and pairs[1][1] is False
  assert all(t.meta == episode.meta for t, _ in pairs)  # the same episode, asked under another intent
  assert {t.task.id for t, _ in tool.relabel([episode], pool, negatives=5, seed=0)} == {"b", "c", "d"}


def test_override_casts_to_the_keys_type_and_refuses_an_unknown_key():
  config = ml_collections.ConfigDict({"orm": {"near_misses": 48, "warmup": {"steps": 300}}, "flag": False})
  tool.override(config, "orm.near_misses=96")
  tool.override(config, "flag=true")
  assert config.orm.near_misses == 96 and config.flag is True
  with pytest.raises(KeyError, match="orm.warmup.stepz"):
    tool.override(config, "orm.warmup.stepz=1")
  with pytest.raises(KeyError, match="nope.steps"):
    tool.override(config, "nope.steps=1")
