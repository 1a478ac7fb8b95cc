"""The closing table every recipe prints."""

import pytest

from jaxagent.pipeline import report

RESULTS = {"sft": {"success_rate": 0.0, "episodes": 100, "temperature": 0.0, "mean_steps": 4.62},
           "a_long_policy_name": {"success_rate": 0.125, "episodes": 96, "temperature": 1.0, "mean_steps": 4.0}}


def test_policy_table_lists_each_policy_with_its_rate_episodes_temperature_and_steps():
  lines = report.policy_table(RESULTS).split("\n")
  assert lines[0].split() == ["policy", "success", "95", "%", "Wilson", "episodes", "intents", "temperature", "mean",
                              "steps"]
  assert lines[1].split() == ["sft", "0.0%", "[", "0.0%,", "3.7%]", "100", "-", "0.00", "4.62"]  # Wilson: 0 of 100
  assert lines[2].split() == ["a_long_policy_name", "12.5%", "[", "7.3%,", "20.6%]", "96", "-", "1.00", "4.00"]
  assert len({line.index("%") for line in lines[1:]}) == 1  # the columns line up whatever the names' lengths


def test_policy_table_counts_distinct_intents_and_pairs_the_comparisons_on_shared_episodes():
  """Two draws of each of 4 intents: 8 episodes, 4 intents; q − il paired over the 4 intents, B − A in points."""
  one = lambda wins: {f"t{i}@{k}": float(i < wins) for i in range(4) for k in range(2)}
  results = {"il": {"success_rate": 0.25, "episodes": 8, "temperature": 0.0, "mean_steps": 4.0, "outcomes": one(1)},
             "q": {"success_rate": 0.5, "episodes": 8, "temperature": 0.0, "mean_steps": 3.5, "outcomes": one(2)},
             "fbc": {"success_rate": 0.25, "episodes": 8, "temperature": 0.0, "mean_steps": 3.0, "outcomes": one(1)}}
  lines = report.policy_table(results, ["il", "fbc", "q"], pairs=[("q", "fbc")]).split("\n")
  assert [line.split()[-3] for line in lines[1:4]] == ["4", "4", "4"]  # intents, before temperature and steps
  assert lines[4:] == ["fbc − il: +0.0 points [+0.0, +0.0], paired over 4 intents",
                       lines[5], lines[6]] and lines[5].startswith("q − il: +25.0 points [")
  assert lines[6].startswith("q − fbc: +25.0 points [") and lines[6].endswith("paired over 4 intents")
  lo, hi = (float(x) for x in lines[6].split("[")[1].split("]")[0].split(", "))
  assert lo <= 25.0 <= hi and lo >= 0.0  # no intent got worse: the interval never goes below 0


def test_policy_table_keeps_the_order_and_subset_asked_for():
  lines = report.policy_table(RESULTS, ["a_long_policy_name"]).split("\n")
  assert len(lines) == 2 and lines[1].startswith("a_long_policy_name")


def test_paired_difference_by_hand_and_its_bootstrap_covers_both_levels():
  from jaxagent.pipeline.report import paired_difference
  out = paired_difference({0: ([0, 0, 1, 1], [1, 0, 1, 1]), 1: ([0, 1], [1, 1])}, resamples=2000)
  assert out["mean"] == pytest.approx((0.25 + 0.5) / 2)
  assert out["per_seed"] == {0: 0.25, 1: 0.5} and out["episodes"] == [4, 2]
  lo, hi = out["ci95"]
  assert 0.0 <= lo <= out["mean"] <= hi <= 1.0 and out["p_improve"] > 0.5  # no pair got worse: never below 0
  same = paired_difference({0: ([1, 0, 1], [1, 0, 1]), 1: ([0, 0], [0, 0])}, resamples=200)
  assert same["mean"] == 0 and same["ci95"] == (0.0, 0.0) and same["p_improve"] == 0.0
  # one seed, all pairs +1 or -1 half and half: the interval straddles 0 symmetrically-ish
  mixed = paired_difference({0: ([0, 1] * 20, [1, 0] * 20)}, resamples=4000)
  assert mixed["ci95"][0] < 0 < mixed["ci95"][1] and 0.3 < mixed["p_improve"] < 0.7
  with pytest.raises(ValueError, match="pair up"):
    paired_difference({0: ([0, 1], [1])})


def test_hierarchical_mean_by_hand_and_its_interval_spans_the_seeds():
  # two seeds of one episode each: the bootstrap mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4
  two = report.hierarchical_mean({0: [1.0], 1: [0.0]}, resamples=4000)
  assert two["mean"] == 0.5 and two["ci95"] == (0.0, 1.0) and two["episodes"] == [1, 1]
  assert report.hierarchical_mean({3: [1, 1, 1]}, resamples=100)["ci95"] == (1.0, 1.0)
  # seeds that disagree completely: 40 episodes pooled would give roughly [0.35, 0.65]; resampling the seeds
  # first keeps the seed-to-seed variation, so the interval reaches both ends
  split = report.hierarchical_mean({0: [1.0] * 20, 1: [0.0] * 20}, resamples=4000)
  assert split["mean"] == 0.5 and split["ci95"] == (0.0, 1.0)
  with pytest.raises(ValueError, match="at least one episode"):
    report.hierarchical_mean({0: [1.0], 1: []})


def _task(i, family, tier, split="test_comb"):
  from jaxagent import types
  return types.Task(id=f"t{i}", intent="x", site="shop", start_url="", split=split, template=family,
                    meta={"family": family, "tier": tier})


def test_outcomes_keep_each_episode_that_ran_with_its_strata():
  from jaxagent import types
  trajs = [types.Trajectory(task=_task(0, "cart", 2), steps=[], success=1.0),
           types.Trajectory(task=_task(1, "buy", 3), steps=[], success=0.0),
           types.Trajectory(task=_task(2, "buy", 3), steps=[], success=None, status="errored")]
  out = report.outcomes(trajs)
  assert out["outcomes"] == {"t0": 1.0, "t1": 0.0}  # errored: neither success nor failure, as in `summary`
  assert out["strata"]["t1"] == {"family": "buy", "tier": "tier3", "split": "test_comb"}
  miniwob = types.Task(id="m", intent="x", site="miniwob", start_url="", template="click-button")
  assert report.strata(miniwob) == {"family": "click-button", "split": "train"}  # the Task default


def test_by_stratum_by_hand():
  st = {"a": {"family": "cart", "split": "s"}, "b": {"family": "cart", "split": "s"},
        "c": {"family": "buy", "split": "s"}}
  per_seed = {0: {"il": {"outcomes": {"a": 0.0, "b": 1.0, "c": 0.0}, "strata": st},
                  "rl": {"outcomes": {"a": 1.0, "b": 1.0, "c": 0.0}, "strata": st}},
              1: {"il": {"outcomes": {"a": 0.0, "b": 0.0}, "strata": st},
                  "rl": {"outcomes": {"a": 1.0, "b": 0.0}, "strata": st}}}  # seed 1 has no "buy" episode
  by = report.by_stratum(per_seed, ["il", "rl"], resamples=500)
  assert set(by["family"]) == {"cart"}  # a stratum missing from a seed is left out
  cart = by["family"]["cart"]
  assert cart["il"]["mean"] == pytest.approx(0.25) and cart["rl"]["mean"] == pytest.approx(0.75)
  assert cart["rl - il"]["mean"] == pytest.approx(0.5) and cart["il"]["episodes"] == [2, 2]
  assert by["split"]["s"]["rl - il"]["per_seed"] == {0: pytest.approx(1 / 3), 1: 0.5}
  table = report.stratum_table(by)
  assert "| cart | 2–2 | 25.0 [" in table and "+50.0 [" in table and "P " in table


def test_by_stratum_pairs_a_recipes_comparisons_beside_those_against_the_first_policy():
  st = {e: {"family": "cart" if e in "ab" else "buy"} for e in "abcd"}
  outcomes = {"il": [0, 0, 1, 0], "fbc": [1, 0, 1, 0], "digiq": [1, 1, 0, 0]}
  per_seed = {s: {n: {"outcomes": dict(zip("abcd", map(float, o))), "strata": st} for n, o in outcomes.items()}
              for s in (0, 1)}
  by = report.by_stratum(per_seed, ["il", "fbc", "digiq"], resamples=200,
                         pairs=[("digiq", "fbc"), ("fbc", "il"), ("missing", "il")])
  cart, buy = by["family"]["cart"], by["family"]["buy"]
  assert [k for k in cart if " - " in k] == ["fbc - il", "digiq - il", "digiq - fbc"]
  assert cart["digiq - fbc"]["mean"] == pytest.approx(0.5)  # (1 - 1 + 1 - 0) / 2
  assert buy["digiq - fbc"]["mean"] == pytest.approx(-0.5)  # (0 - 1 + 0 - 0) / 2
  assert "| cart |" in report.stratum_table(by) and "digiq - fbc" in report.stratum_table(by)


def test_policy_table_skips_derived_values_and_lists_the_control_below():
  results = {**RESULTS, "digiq_minus_il": 0.1, "held_out": True,
             "control": {"sft": {"success_rate": 0.5, "episodes": 8, "temperature": 0.0, "mean_steps": 5.0}}}
  lines = report.policy_table(results).split("\n")
  assert [line.split()[0] for line in lines[1:]] == ["sft", "a_long_policy_name", "control:"]
  assert lines[3].split()[:3] == ["control:", "sft", "50.0%"] and lines[3].split()[-4:] == ["8", "-", "0.00", "5.00"]


def test_by_intent_averages_an_intents_draws_so_it_counts_once():
  outcomes = {"a@0": 1.0, "b@0": 1.0, "a@1": 0.0, "c": 0.0}
  assert report.by_intent(outcomes, ["a@0", "b@0", "a@1", "c"]) == [0.5, 1.0, 0.0]
  assert report.task_key("a@1") == "a"
