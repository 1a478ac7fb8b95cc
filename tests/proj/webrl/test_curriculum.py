"""WebRL's offline curriculum (`proj/webrl/curriculum.py`)."""

import dataclasses

from jaxagent import types
from jaxagent.proj.webrl import curriculum


def _task(tid, template, intent):
  return types.Task(id=tid, intent=intent, site="shop", start_url="http://127.0.0.1/shop", template=template,
                    evaluator={"kind": "string_match", "exact_match": tid})


def _pool(sizes=None):
  sizes = sizes or {"A": 5, "B": 3}
  return [_task(f"{t}{i}", t, f"{t.lower()} intent {i}") for t, n in sizes.items() for i in range(n)]


def _source(pool, out_task):
  by_id = {t.id: t for t in pool}
  base, _, suffix = out_task.id.partition("@")
  return by_id[base], suffix


def test_variations_are_other_intents_of_the_failed_tasks_template():
  pool = _pool()
  a0 = pool[0]
  out = curriculum.variations([a0], pool, 4, seed=0, tag="p1-")
  assert len(out) == 4
  assert all(t.template == "A" and t.intent != a0.intent for t in out)
  # four other A intents exist, so no intent is drawn twice
  assert sorted(t.intent for t in out) == ["a intent 1", "a intent 2", "a intent 3", "a intent 4"]


def test_variations_prefer_fresh_intents_then_repeat():
  pool = _pool()
  out = curriculum.variations([pool[0]], pool, 6, seed=1, tag="x")
  first = [t.intent for t in out[:4]]
  assert len(set(first)) == 4  # fresh ones first
  assert all(t.intent in first for t in out[4:])  # then the already drawn ones
  assert all(t.intent != pool[0].intent for t in out)


def test_variations_cycle_the_failed_tasks_in_a_seeded_order():
  pool = _pool()
  a0, b0 = pool[0], pool[5]
  out = curriculum.variations([a0, b0], pool, 6, seed=3, tag="t")
  templates = [t.template for t in out]
  assert sorted(templates[:2]) == ["A", "B"]
  assert templates == templates[:2] * 3
  for t in out:
    assert t.intent != (a0 if t.template == "A" else b0).intent
  # 4 other A intents for 3 A draws, 2 other B intents for 3 B draws: all A fresh, both B ones used
  assert len({t.intent for t in out if t.template == "A"}) == 3
  assert {t.intent for t in out if t.template == "B"} == {"b intent 1", "b intent 2"}


def test_variation_ids_name_their_pool_task_and_the_rest_is_the_pool_task():
  pool = _pool()
  out = curriculum.variations([pool[1], pool[6]], pool, 5, seed=0, tag="ph2-")
  assert len({t.id for t in out}) == 5
  for k, t in enumerate(out):
    src, suffix = _source(pool, t)
    assert suffix == f"ph2-{k}"
    assert t.id == f"{src.id}@ph2-{k}"
    assert dataclasses.replace(t, id=src.id) == src  # same intent, evaluator, template ...


def test_a_template_with_no_other_intent_falls_back_to_the_pool():
  pool = _pool({"A": 3, "C": 1}) + [_task("C0bis", "C", "c intent 0")]  # C's tasks all share one intent
  out = curriculum.variations([pool[3]], pool, 4, seed=0, tag="f")
  ids = {t.id for t in pool}
  assert all(_source(pool, t)[0].id in ids for t in out)
  assert len({t.intent for t in out}) == 4  # the whole pool's 4 intents, fresh first


def test_no_failures_draw_pool_tasks():
  pool = _pool()
  out = curriculum.variations([], pool, 8, seed=0, tag="n")
  assert len(out) == 8
  assert all(_source(pool, t)[0] in pool for t in out)
  assert len({t.intent for t in out}) == 8  # 8 distinct intents in the pool, all fresh
  assert curriculum.variations([], pool, 0, seed=0, tag="n") == []


def test_variations_are_deterministic_by_seed():
  pool = _pool({"A": 40, "B": 40})
  failed = [pool[0], pool[1], pool[40], pool[41], pool[42]]
  first = curriculum.variations(failed, pool, 20, seed=7, tag="s")
  again = curriculum.variations(failed, pool, 20, seed=7, tag="s")
  other = curriculum.variations(failed, pool, 20, seed=8, tag="s")
  assert [t.id for t in first] == [t.id for t in again]
  assert [t.id for t in first] != [t.id for t in other]


def test_round0_prompt_is_filter_by_critics_f_string():
  task, html = "Find the cheapest mug", '<html><a id="1">Mugs</a></html>'
  expected = (f"Task Instruction: {task}\n\nRound 0\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
              f"{html}\n\n<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n")
  assert curriculum.round0_prompt(task, html) == expected
