"""The standalone evaluator: Wilson intervals against hand-computed values, suite parsing, and a real run of the
scripted expert on the bundled sites over two seeds (two worlds), with its results.json and HTML report."""

import argparse
import json
import os

import pytest

from jaxagent import evaluate
from jaxagent.pipeline import report


@pytest.mark.parametrize("k,n,low,high", [
    (5, 10, 0.2366, 0.7634),  # centre 0.5, half-width 1.96·sqrt(.025 + 1.96²/400) / (1 + 1.96²/10)
    (0, 10, 0.0, 0.2775),  # not degenerate at 0 successes, unlike p ± 1.96·sqrt(p(1-p)/n)
    (10, 10, 0.7225, 1.0),
    (16, 100, 0.1010, 0.2442),
])
def test_wilson_interval_matches_hand_computation(k, n, low, high):
  lo, hi = report.wilson_interval(k, n)
  assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_wilson_interval_edges():
  assert report.wilson_interval(0, 0) == (0.0, 1.0)
  with pytest.raises(ValueError, match="successes=11"):
    report.wilson_interval(11, 10)


def test_over_seeds_is_mean_and_sample_std():
  out = report.over_seeds({0: {"success_rate": 0.2}, 1: {"success_rate": 0.4}, 2: {"success_rate": 0.6}})
  assert out["mean"] == pytest.approx(0.4) and out["std"] == pytest.approx(0.2) and out["seeds"] == [0, 1, 2]


@pytest.mark.parametrize("spec,error", [("sites:device", "PROFILE/SPLIT"), ("miniwob:", "name the MiniWoB"),
                                        ("file:/nowhere.jsonl", "not a task file"), ("webarena:x", "start with")])
def test_bad_suites_are_refused_naming_the_form(spec, error):
  with pytest.raises(ValueError, match=error):
    evaluate.Suite.parse(spec)


def test_sites_suite_selects_split_and_families():
  suite = evaluate.Suite.parse("sites:device/test/shop_price")
  tasks = suite.tasks(0)
  assert tasks and {t.template for t in tasks} == {"shop_price"} and {t.split for t in tasks} == {"test"}
  assert {t.seed for t in suite.tasks(1)} == {1}


@pytest.mark.browser
@pytest.mark.slow
def test_expert_on_two_worlds_writes_results_and_report(tmp_path):
  out = str(tmp_path / "eval")
  evaluate.main(["--policy", "expert", "--suite", "sites:device/test/shop_price", "--episodes", "2",
                 "--seeds", "0,1", "--out", out, "--workers", "1"])
  results = json.load(open(os.path.join(out, "results.json")))
  assert set(results["seeds"]) == {"0", "1"}
  for seed in ("0", "1"):
    s = results["seeds"][seed]
    assert s["episodes"] == 2 and s["success_rate"] == 1.0 and s["ci95"][1] == 1.0 and s["mean_steps"] > 1
    assert sum(t["episodes"] for t in results["per_task"][seed].values()) == 2
  assert results["success_rate"]["mean"] == 1.0
  page = open(os.path.join(out, "seed1", "report.html")).read()
  assert page.count("<figure>") >= 4 and "report_images/" in page
  # a rerun resumes: nothing left to run, the same figures
  evaluate.main(["--policy", "expert", "--suite", "sites:device/test/shop_price", "--episodes", "2",
                 "--seeds", "0,1", "--out", out, "--workers", "1"])
  assert json.load(open(os.path.join(out, "results.json")))["seeds"] == results["seeds"]


def test_bench_suite_parses_and_refuses_bad_splits():
  suite = evaluate.Suite.parse("bench:web/headline@1/filter")
  tasks = suite.tasks(0)
  assert tasks and {t.meta["family"] for t in tasks} == {"filter"} and suite.profile == "web"
  assert all(t.meta["perturb"]["level"] == 1 for t in tasks)
  with pytest.raises(ValueError, match="split 'tset'"):
    evaluate.Suite.parse("bench:web/tset")


@pytest.mark.browser
@pytest.mark.slow
def test_expert_on_the_benchmark_reports_families_and_rubric(tmp_path):
  """Per-family success and the rubric beside the total, at perturbation level 2."""
  out = str(tmp_path / "bench")
  evaluate.main(["--policy", "expert", "--suite", "bench:device/test_comb@2/filter,cart", "--episodes", "2",
                 "--out", out, "--workers", "1"])
  results = json.load(open(os.path.join(out, "results.json")))
  fam = results["by_family"]["0"]
  assert fam["all"]["episodes"] == 2 and fam["all"]["success_rate"] == 1.0 and fam["all"]["rubric"] == 1.0
  assert results["success_rate"]["hierarchical"]["ci95"] == [1.0, 1.0] and len(results["outcomes"]["0"]) == 2
  assert set(results["by_stratum"]["family"]) <= {"filter", "cart"} and "test_comb" in results["by_stratum"]["split"]


@pytest.mark.slow
def test_expert_on_the_text_backend_plays_every_intent_of_a_split(tmp_path):
  """`--browser text`: no Chromium; the expert solves every buy intent of test_iid at level 2, each once."""
  out = str(tmp_path / "text")
  evaluate.main(["--policy", "expert", "--suite", "bench:web/test_iid@2/buy", "--format", "webrl",
                 "--browser", "text", "--out", out, "--workers", "1"])
  results = json.load(open(os.path.join(out, "results.json")))
  fam = results["by_family"]["0"]
  assert results["browser"] == "text" and fam["all"]["episodes"] == 10 and fam["all"]["success_rate"] == 1.0


def test_text_backend_refuses_formats_that_see_the_screen(tmp_path):
  with pytest.raises(ValueError, match="--browser text renders WebRL's simplified HTML only"):
    evaluate.main(["--policy", "expert", "--suite", "bench:web/test_iid@0/buy", "--format", "webvoyager",
                   "--browser", "text", "--out", str(tmp_path)])


def test_miniwob_suite_plays_distinct_held_out_instances_each_once():
  """Not the global seed's one training instance replayed: each seed plays distinct held-out instances (seed 0 the
  GRPO recipe's test seeds), every one once, and seeds share none."""
  from jaxagent.envs import miniwob  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.tasks import draw_episodes  # pylint: disable=g-import-not-at-top
  suite = evaluate.Suite.parse("miniwob:click-button,click-link")
  played = {}
  for seed in (0, 1):
    episodes = draw_episodes(suite.tasks(seed, 8), 8, seed, tag=f"eval{seed}.")
    played[seed] = {(t.template, t.seed) for t in episodes}
    assert len(played[seed]) == 8 and all(t.seed >= miniwob.TEST_SEED_BASE for t in episodes)
  assert not played[0] & played[1]
  recipe_test = miniwob.training_suite("test", 4, names=("click-button", "click-link"))
  assert played[0] == {(t.template, t.seed) for t in recipe_test}
  assert len(suite.tasks(0, 5)) == 6  # ⌈5 / 2⌉ instances a task, 5 of them drawn
  spec = evaluate.env_spec(suite, [], "webrl", False, "")
  assert spec["episode_max_time_ms"] == 0  # the step limit ends an episode, not the page's clock
  assert evaluate.env_spec(suite, [], "webrl", False, "", page_clock=True)["episode_max_time_ms"] is None
  with pytest.raises(SystemExit):
    evaluate.main(["--policy", "expert", "--suite", "miniwob:click-button", "--seeds", "-1", "--out", "/nowhere"])


def test_a_negative_prefix_cache_is_refused_naming_the_flag(capsys):
  with pytest.raises(SystemExit):
    evaluate.main(["--policy", "expert", "--suite", "sites:web/test", "--prefix-cache-mb", "-1", "--out", "/nowhere"])
  assert "--prefix-cache-mb=-1.0 must be ≥ 0" in capsys.readouterr().err


def test_a_format_the_actor_was_not_trained_in_is_refused_and_its_own_keeps_its_options(tmp_path, capsys):
  """A WebRL actor trained on compact HTML cut at 2,048 characters: `--format webvoyager` is refused naming both
  formats, `--format webrl` acts with the recorded options (not the format's default, full HTML at 15,872)."""
  from jaxagent.agents import spec  # pylint: disable=g-import-not-at-top
  from jaxagent.agents.webrl import WebRL  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.policy import agent_format  # pylint: disable=g-import-not-at-top
  actor = str(tmp_path / "actor")
  os.makedirs(actor)
  trained = WebRL(compact=True, max_prompt_chars=2048)
  spec.write(actor, trained, None)
  with pytest.raises(SystemExit):
    evaluate.main(["--policy", actor, "--suite", "sites:web/test", "--format", "webvoyager", "--out", str(tmp_path)])
  err = capsys.readouterr().err
  assert "--format webvoyager" in err and "'webrl'" in err
  args = argparse.Namespace(policy=actor, format="webrl", parse="")
  fmt = agent_format(actor, *evaluate.load_args(args, "webrl"))
  assert fmt.options() == trained.options() and fmt.options()["max_prompt_chars"] == 2048
