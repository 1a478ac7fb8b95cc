"""`data_tools/paired_runs.py`: two runs' per-episode outcomes paired by episode id, seed by seed."""

import json

import pytest

from data_tools import paired_runs


def _run(root, name, per_seed):
  for seed, outcomes in per_seed.items():
    d = root / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({name: {"success_rate": 0.0, "outcomes": outcomes}}))


def test_pairs_by_episode_and_refuses_runs_on_other_episodes(tmp_path, capsys):
  _run(tmp_path / "a", "grpo", {0: {"e1": 0.0, "e2": 1.0}, 1: {"e1": 0.0, "e2": 0.0}})
  _run(tmp_path / "b", "grpo", {0: {"e2": 1.0, "e1": 1.0}, 1: {"e1": 1.0, "e2": 0.0}})
  d = paired_runs.main([f"{tmp_path / 'a'}:grpo", f"{tmp_path / 'b'}:grpo", "--resamples", "500"])
  assert d["mean"] == pytest.approx(0.5) and d["per_seed"] == {0: 0.5, 1: 0.5}
  assert "seed 0: grpo 50.0%  grpo 100.0%" in capsys.readouterr().out
  _run(tmp_path / "c", "grpo", {0: {"e1": 0.0, "e3": 1.0}, 1: {"e1": 0.0, "e2": 0.0}})
  with pytest.raises(ValueError, match="different episodes"):
    paired_runs.main([f"{tmp_path / 'a'}:grpo", f"{tmp_path / 'c'}:grpo"])
  with pytest.raises(ValueError, match="no per-episode outcomes"):
    paired_runs.main([f"{tmp_path / 'a'}:il", f"{tmp_path / 'b'}:grpo"])


def test_kept_records_pair_seed_by_seed_in_their_order(tmp_path):
  """Kept records (`docs/results/data/*.headline.json`: one evaluation's outcomes, flat or under its seed's key)
  pair by position; the committed start-from-scratch and base records give the results page's figure."""
  write = lambda name, outcomes: (tmp_path / name).write_text(json.dumps({"what": "", "outcomes": outcomes}))
  write("a1.json", {"0": {"e1": 0.0, "e2": 0.0}})
  write("a2.json", {"e1": 1.0, "e2": 0.0})
  write("b1.json", {"0": {"e2": 1.0, "e1": 1.0}})
  write("b2.json", {"e1": 1.0, "e2": 1.0})
  d = paired_runs.main([f"{tmp_path}/a1.json,{tmp_path}/a2.json", f"{tmp_path}/b1.json,{tmp_path}/b2.json",
                        "--resamples", "500"])
  assert d["per_seed"] == {0: 1.0, 1: 0.5}
  data = "docs/results/data/{}_seed{}_zen3.headline.json"
  side = lambda run: ",".join(data.format(run, k) for k in (1, 2))
  d = paired_runs.main([side("scratch_il_d384"), side("pretrain_il_base11_d384"), "--resamples", "2000"])
  assert d["per_seed"] == pytest.approx({0: 2 / 210, 1: 20 / 210})  # 3 − 1 and 20 − 0 of 210
