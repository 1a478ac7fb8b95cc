"""The stage runner: skip-when-done, atomic summaries, timings, and the warning for a finished stage that ran
with other config values."""

import json
import os

import ml_collections
import pytest

from jaxagent.pipeline import stages as stages_lib
from jaxagent.pipeline.stages import DONE, Stages


def test_finished_stage_is_skipped_and_keeps_its_summary(tmp_path, capsys):
  calls = []
  first = Stages(str(tmp_path), "t").run("s", lambda out: calls.append(out) or {"n": 1})
  second = Stages(str(tmp_path), "t").run("s", lambda out: calls.append(out) or {"n": 2})
  assert first == second == {"n": 1} and len(calls) == 1
  assert json.load(open(tmp_path / "s" / DONE)) == {"n": 1}
  assert set(json.load(open(tmp_path / "timings.json"))) == {"s"}
  assert "[t] s: done already, skipped" in capsys.readouterr().out


def test_a_failed_stage_leaves_no_done_marker(tmp_path):
  def boom(out):
    raise RuntimeError("stage failed")
  try:
    Stages(str(tmp_path), "t").run("s", boom)
  except RuntimeError:
    pass
  assert not os.path.exists(tmp_path / "s" / DONE)


def test_rerun_with_other_values_names_what_the_finished_stage_used(tmp_path, capsys):
  config = ml_collections.ConfigDict({"il": {"train": {"steps": 500}}, "seed": 0})
  Stages(str(tmp_path), "t", config).run("il", lambda out: {})
  config.il.train.steps = 800
  Stages(str(tmp_path), "t", config).run("il", lambda out: {})
  out = capsys.readouterr().out
  assert "il.train.steps=500 (now 800)" in out and "seed" not in out.split("skipped")[1]


def test_the_time_table_adds_runners_in_subdirectories_but_not_those_inside_a_stage(tmp_path):
  outer = Stages(str(tmp_path), "t")
  outer.run("sft", lambda out: {})
  # a runner inside a stage (DigiRL's online/): its time is already the stage's
  outer.run("online", lambda out: Stages(out, "t/online").run("round", lambda o: {}) and {})
  for t in (1, 2, 10):  # runners beside the stages (WebRL's phase<t>/)
    Stages(str(tmp_path / f"phase{t}"), f"t/phase{t}").run("actor", lambda out: {})
  json.dump({"actor": 5.0}, open(tmp_path / "phase2" / "timings.json", "w"))
  nested = outer.nested_times()
  assert list(nested) == ["phase1/actor", "phase2/actor", "phase10/actor"] and nested["phase2/actor"] == 5.0
  table = outer.table().splitlines()
  assert [r.split()[0] for r in table[1:]] == ["sft", "online", "phase1/actor", "phase2/actor", "phase10/actor",
                                               "total"]
  total = float(table[-1].split()[1])
  assert abs(total - (sum(outer.times.values()) + sum(nested.values()))) < 0.11
  assert total >= 5.0


def test_each_stage_line_is_written_whole_with_its_newline(tmp_path, monkeypatch):
  """Under `launch.local` (unbuffered) a native log line can land between two writes of one line: every line
  the runner says is one write, newline included."""
  class Recorder:
    def __init__(self):
      self.writes = []
    def write(self, text):
      self.writes.append(text)
      return len(text)
    def flush(self):
      pass
  recorder = Recorder()
  monkeypatch.setattr("sys.stdout", recorder)
  Stages(str(tmp_path), "t").run("s", lambda out: {"n": 1})
  Stages(str(tmp_path), "t").run("s", lambda out: {"n": 2})
  assert recorder.writes == ["[t] s ...\n", '[t] s: {"n": 1}\n', "[t] s: done already, skipped\n"]


def test_a_stage_line_shortens_long_collections_and_the_done_file_keeps_them(tmp_path, capsys):
  outcomes = {f"task{i}": float(i % 2) for i in range(270)}
  summary = {"il": {"success_rate": 0.5, "outcomes": outcomes}, "steps": list(range(3))}
  assert Stages(str(tmp_path), "t").run("eval", lambda out: summary) == summary
  line = capsys.readouterr().out.splitlines()[-1]
  assert line == '[t] eval: {"il": {"success_rate": 0.5, "outcomes": "<270 entries>"}, "steps": [0, 1, 2]}'
  assert Stages(str(tmp_path), "t").run("eval", lambda out: {}) == summary  # read back whole from DONE


def test_stop_after_ends_the_run_once_its_stage_is_done_run_or_skipped(tmp_path, monkeypatch):
  monkeypatch.setattr(stages_lib, "STOP_AFTER", "b")
  ran = []
  def run_all():
    s = Stages(str(tmp_path), "t")
    for name in ("a", "b", "c"):
      s.run(name, lambda out, n=name: ran.append(n) or {})
  with pytest.raises(stages_lib.StopAfter):
    run_all()
  assert ran == ["a", "b"] and not os.path.exists(tmp_path / "c")
  with pytest.raises(stages_lib.StopAfter):  # a rerun stops there too, with both stages skipped
    run_all()
  assert ran == ["a", "b"]
