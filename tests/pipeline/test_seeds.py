"""The multi-seed runner: per-seed workdirs and configs, and how per-seed results combine."""

import json
import os
import statistics
import subprocess
import sys

import ml_collections
import pytest

from jaxagent.pipeline import seeds


def _results(il, digiq, minus, monotone):
  return {"il_actor": {"success_rate": il, "episodes": 100, "temperature": 0.8, "mean_steps": 5.0 + il},
          "digiq_actor": {"success_rate": digiq, "episodes": 100, "temperature": 0.8, "mean_steps": 4.0},
          "digiq_minus_il": minus, "held_out": True, "monotone": monotone}


def test_success_rates_become_mean_and_spread_over_seeds():
  per_seed = {0: _results(0.10, 0.30, 0.20, True), 1: _results(0.20, 0.35, 0.15, False),
              2: _results(0.15, 0.50, 0.35, True)}
  out = seeds.combine(per_seed)
  il = out["il_actor"]
  assert il["success_rate"] == pytest.approx(0.15)
  assert il["std"] == pytest.approx(statistics.stdev([0.10, 0.20, 0.15]))
  assert (il["min"], il["max"]) == (0.10, 0.20)
  assert il["per_seed"] == {"0": 0.10, "1": 0.20, "2": 0.15}
  assert il["episodes"] == 100 and il["temperature"] == 0.8  # equal across seeds: kept as is
  assert il["mean_steps"] == pytest.approx(5.15)  # other numbers: their mean
  assert out["digiq_actor"]["success_rate"] == pytest.approx(0.38333333)
  assert out["digiq_minus_il"] == pytest.approx(0.70 / 3)
  assert out["held_out"] is True
  assert out["monotone"] == [True, False, True]  # disagreeing flags stay per seed


def test_lists_combine_element_by_element():
  rows = lambda a, b: {"per_iteration": [{"success_rate": a}, {"success_rate": b}]}
  out = seeds.combine({0: rows(0.1, 0.3), 1: rows(0.3, 0.5)})
  assert [r["success_rate"] for r in out["per_iteration"]] == pytest.approx([0.2, 0.4])


def test_openwebvoyager_stages_get_a_spread_and_a_table_row():
  """OpenWebVoyager's rows name their rate `test_success_rate`: each stage gets the spread and a table row."""
  rows = lambda a, b: {"per_iteration": [{"stage": "il", "test_success_rate": a},
                                         {"stage": "iter1", "test_success_rate": b}], "monotone": True}
  out = seeds.combine({0: rows(0.0, 0.125), 1: rows(0.125, 0.375)})
  iter1 = out["per_iteration"][1]
  assert iter1["test_success_rate"] == pytest.approx(0.25) and iter1["per_seed"] == {"0": 0.125, "1": 0.375}
  assert iter1["std"] == pytest.approx(statistics.stdev([0.125, 0.375]))
  lines = seeds.table(out).split("\n")
  assert [l.split()[0] for l in lines[1:]] == ["il", "iter1"]
  assert "25.0% ±" in lines[2] and "1: 37.5%" in lines[2]


def test_parse_seeds_refuses_repeats_and_junk():
  assert seeds.parse_seeds("0,1, 2") == [0, 1, 2]
  for bad in ("0,0", "a,b", ","):
    with pytest.raises(ValueError, match="--seeds"):
      seeds.parse_seeds(bad)


def test_run_seeds_runs_each_seed_in_its_own_workdir(tmp_path):
  config = ml_collections.ConfigDict({"seed": 0, "eval": {"episodes": 4}})
  config.lock()
  calls = []

  def run(cfg, workdir):
    calls.append((cfg.seed, workdir))
    return {"actor": {"success_rate": cfg.seed / 4, "episodes": 4, "temperature": 1.0}}

  written = []
  out = seeds.run_seeds(run, config, str(tmp_path), [3, 1], lambda cfg, d: written.append((cfg.seed, d)))
  assert calls == written == [(3, str(tmp_path / "seed3")), (1, str(tmp_path / "seed1"))]
  assert config.seed == 0  # the caller's config is not changed
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert "packages" in saved.pop("provenance") and saved == out and saved["seeds"] == [3, 1]
  assert saved["actor"]["success_rate"] == pytest.approx(0.5)
  assert saved["actor"]["per_seed"] == {"3": 0.75, "1": 0.25}


def test_a_recipe_returning_a_checkpoint_path_gets_its_per_seed_checkpoints_listed(tmp_path, capsys):
  """The il recipe returns its final checkpoint, not results: nothing to average, each seed's path recorded."""
  config = ml_collections.ConfigDict({"seed": 0})
  out = seeds.run_seeds(lambda cfg, workdir: os.path.join(workdir, "checkpoints", "7"), config, str(tmp_path),
                        [0, 2], lambda cfg, d: None)
  want = {"0": str(tmp_path / "seed0" / "checkpoints" / "7"), "2": str(tmp_path / "seed2" / "checkpoints" / "7")}
  assert out == {"seeds": [0, 2], "per_seed": want}
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert "packages" in saved.pop("provenance") and saved == out
  printed = capsys.readouterr().out
  assert "no evaluation results to combine" in printed and "python -m jaxagent.evaluate" in printed
  assert f"seed 2: {want['2']}" in printed


@pytest.mark.slow
def test_cli_refuses_bad_seeds_before_any_work(tmp_path):
  workdir = tmp_path / "w"
  proc = subprocess.run([sys.executable, "-m", "jaxagent.main", "--config=configs/il.py:smoke",
                         f"--workdir={workdir}", "--seeds=1,1"], capture_output=True, text=True, timeout=300,
                        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  assert proc.returncode != 0 and "--seeds" in proc.stderr
  assert not workdir.exists()


def test_policies_with_per_episode_outcomes_get_paired_differences_against_the_first():
  def res(il, grpo):
    return {"il": {"success_rate": sum(il.values()) / len(il), "outcomes": il},
            "grpo": {"success_rate": sum(grpo.values()) / len(grpo), "outcomes": grpo}}
  per_seed = {0: res({"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 1.0}), 1: res({"a": 0.0, "b": 0.0}, {"a": 0.0, "b": 1.0})}
  paired = seeds.paired_differences(per_seed)["paired"]["grpo - il"]
  assert paired["mean"] == pytest.approx(0.5) and paired["per_seed"] == {0: 0.5, 1: 0.5}
  assert 0.9 < paired["p_improve"] < 1.0  # a resample may draw only the tied episodes
  assert "outcomes" not in seeds.combine(seeds._without_outcomes(per_seed))["il"]  # pylint: disable=protected-access
  assert seeds.paired_differences({0: {"il": {"success_rate": 0.5}}}) == {}
  hier = seeds.hierarchical(per_seed)
  assert hier["il"]["mean"] == pytest.approx(0.25) and hier["grpo"]["mean"] == pytest.approx(0.75)
  assert seeds.stratified(per_seed) == {}  # no strata recorded: no breakdown


@pytest.mark.slow
def test_run_seeds_writes_each_policys_interval_and_the_breakdown_by_stratum(tmp_path):
  st = {"a": {"family": "cart", "split": "test_comb"}, "b": {"family": "buy", "split": "test_value"}}

  def run(cfg, out):
    il = {"a": 0.0, "b": float(cfg.seed)}
    return {"il": {"success_rate": sum(il.values()) / 2, "outcomes": il, "strata": st},
            "rl": {"success_rate": 1.0, "outcomes": {"a": 1.0, "b": 1.0}, "strata": st}}

  config = ml_collections.ConfigDict({"seed": 0})
  combined = seeds.run_seeds(run, config, str(tmp_path), [0, 1], lambda c, d: os.makedirs(d, exist_ok=True))
  assert combined["il"]["hierarchical"]["mean"] == pytest.approx(0.25) and "outcomes" not in combined["il"]
  assert "strata" not in combined["rl"]
  assert combined["paired"]["rl - il"]["mean"] == pytest.approx(0.75)
  assert combined["by_stratum"]["family"]["buy"]["rl - il"]["per_seed"] == {0: 1.0, 1: 0.0}
  assert combined["by_stratum"]["split"]["test_comb"]["il"]["mean"] == 0.0
  written = json.load(open(tmp_path / "results.json"))
  assert written["by_stratum"]["family"]["cart"]["rl"]["mean"] == 1.0


@pytest.mark.slow
def test_a_recipes_pairs_are_paired_beside_those_against_the_first_policy():
  outcomes = {"il": [0, 0, 1, 0], "fbc": [1, 0, 1, 0], "digiq": [1, 1, 1, 0]}
  per_seed = {s: {n: {"success_rate": sum(o) / 4, "outcomes": {f"e{i}": float(x) for i, x in enumerate(o)}}
                  for n, o in outcomes.items()} for s in (0, 1)}
  paired = seeds.paired_differences(per_seed, pairs=[("digiq", "fbc"), ("fbc", "il"), ("missing", "il")])["paired"]
  assert list(paired) == ["fbc - il", "digiq - il", "digiq - fbc"]  # no duplicate, no pair without outcomes
  assert paired["digiq - fbc"]["mean"] == pytest.approx(0.25)
  assert paired["digiq - il"]["mean"] == pytest.approx(0.5)


def test_seed_workdirs_lists_the_seed_directories_by_seed(tmp_path):
  for name in ("seed10", "seed2", "seedx", "il"):
    (tmp_path / name).mkdir()
  (tmp_path / "seed3").write_text("not a directory")
  assert seeds.seed_workdirs(str(tmp_path)) == {2: str(tmp_path / "seed2"), 10: str(tmp_path / "seed10")}
  assert seeds.seed_workdirs(str(tmp_path / "missing")) == {}
