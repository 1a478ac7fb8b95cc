"""The benchmark's tabular separation check: the margins docs/benchmark.md fixed before any neural run."""

import collections

import pytest

from data_tools import bench_check
from jaxagent.envs.sites import bench, linkgraph
from jaxagent.rl import tabular


@pytest.mark.slow
@pytest.mark.long
def test_tabular_margins_hold_at_level_2():
  """Headline: Q − FBC ≥ 10 and FBC − IL ≥ 10 points; negative control: |Q − FBC| ≤ 3 (docs/benchmark.md)."""
  r = bench_check.check(level=2, episodes=1000, control_episodes=10, log=lambda *_: None)
  m = r["margins"]
  assert m["q_minus_fbc"] >= 10, m
  assert m["fbc_minus_il"] >= 10, m
  assert abs(m["control_q_minus_fbc"]) <= 3, m
  assert r["headline"]["expert"]["all"]["success"] == 100.0
  assert r["headline"]["random"]["all"]["success"] <= 2.0


def test_abstraction_is_relative_to_the_goal():
  task = next(t for t in bench.generate(0, "web", 0, splits=("test_comb",))["test_comb"]
              if t.meta["family"] == "filter" and t.meta["params"]["brand"] and t.meta["params"]["order"]
              and not t.meta["params"]["colour"])
  goal = tabular.goal_of(task)
  p = task.meta["params"]
  good = tabular.abstract_url(f"/shop/c/{p['category']}?brand={p['brand']}&sort={p['order']}", goal)
  assert good == ("shop/c", (("category", "="), ("brand", "="), ("sort", "=")))
  other = tabular.abstract_url("/shop/c/zzz?brand=Nobody", goal)
  assert other == ("shop/c", (("category", "≠"), ("brand", "≠"), ("sort", "∅")))
  # two intents of the family share abstract states: what a policy that reads its instruction generalises over
  task2 = next(t for t in bench.generate(0, "web", 0, splits=("train_b",))["train_b"]
               if t.meta["family"] == "filter" and t.meta["params"]["brand"] and t.meta["params"]["order"]
               and not t.meta["params"]["colour"])
  p2 = task2.meta["params"]
  assert p2 != p
  assert tabular.abstract_url(f"/shop/c/{p2['category']}?brand={p2['brand']}&sort={p2['order']}",
                              tabular.goal_of(task2)) == good


def test_tables_and_extraction_on_hand_made_episodes():
  t = tabular.Tables(gamma=0.5)
  s, good, bad = ("s",), ("good",), ("bad",)
  t.add([tabular.Transition(s, bad), tabular.Transition(("s2",), ("stop",))], 0.0)
  t.add([tabular.Transition(s, good), tabular.Transition(("s2",), ("stop",))], 1.0)
  t.add([tabular.Transition(s, bad)], 1.0)
  assert t.q(s, good) == pytest.approx(0.5)  # γ^(T−1−t) with T = 2, t = 0
  assert t.q(s, bad) == pytest.approx((0.0 + 1.0) / 2)
  assert t.count[s] == collections.Counter({bad: 2, good: 1}) and t.success_count[s] == collections.Counter(
      {good: 1, bad: 1})
  assert t.q(s, ("never",)) is None


def test_recorder_keeps_one_transition_per_step():
  task = bench.generate(0, "web", 1, splits=("test_comb",))["test_comb"][0]
  rec = bench_check.Recorder(linkgraph.LinkExpert())
  ep = linkgraph.run(linkgraph.LinkEnv(0), rec, task, seed=0)
  assert len(rec.steps) == len(ep.steps) > 0


def test_paired_margins_pair_intents_within_each_world():
  """Per world and over worlds: B − A intent by intent, in points, with an interval that holds the mean."""
  def world(il, fbc, q):
    return {"outcomes": {"il": {"headline": il, "control": il}, "fbc": {"headline": fbc, "control": fbc},
                         "q": {"headline": q, "control": q}}}

  per_seed = {0: world([0, 0, 1, 0], [1, 0, 1, 0], [1, 1, 1, 0]), 1: world([0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0])}
  m = bench_check.paired_margins(per_seed, resamples=2_000)
  assert m["q_minus_fbc"]["0"]["mean"] == pytest.approx(25.0)
  assert m["q_minus_fbc"]["1"]["mean"] == pytest.approx(0.0)
  assert m["q_minus_fbc"]["1"]["ci95"] == [0.0, 0.0]  # the same outcome on every intent: no spread
  assert m["fbc_minus_il"]["all"]["mean"] == pytest.approx(25.0)  # (25 + 25) / 2
  assert m["fbc_minus_il"]["all"]["episodes"] == 8
  lo, hi = m["q_minus_fbc"]["all"]["ci95"]
  assert lo <= m["q_minus_fbc"]["all"]["mean"] <= hi
  table = bench_check.margins_markdown(m)
  assert "| all | +12.5" in table and table.count("\n") == 4  # header, rule, worlds 0 and 1, all
