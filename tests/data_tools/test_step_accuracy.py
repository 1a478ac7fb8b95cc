"""Step accuracy on the expert's steps: what counts as the expert's action, and the tallies by family and step."""

import pytest

from data_tools import step_accuracy
from jaxagent.agents.webrl import WebRL
from jaxagent.types import Step, Task, Trajectory

FMT = WebRL()
STOP = '# Note: The task is complete.\nexit(message="Done.")'


def _click(name, element):
  return f'# Note: I will click "{name}".\ndo(action="Click", element="{element}")'


def _type(text, element):
  return f'# Note: I will type "{text}" into the field.\ndo(action="Type", argument="{text}", element="{element}")'


def test_an_action_is_right_with_the_experts_kind_element_and_string():
  assert step_accuracy.same_action(FMT, _click("Home", 5), _click("Home", 5)) == (True, True)
  assert step_accuracy.same_action(FMT, _click("Kitchen", 5), _click("Home", 5)) == (True, True)  # the act counts
  assert step_accuracy.same_action(FMT, _click("Home", 6), _click("Home", 5)) == (False, False)
  assert step_accuracy.same_action(FMT, _type("So true", 16), _type("So true.", 16)) == (False, True)
  assert step_accuracy.same_action(FMT, _click("x", 16), _type("So true.", 16)) == (False, True)
  assert step_accuracy.same_action(FMT, 'exit(message="42")', 'exit(message="4.2")') == (False, True)
  assert step_accuracy.same_action(FMT, "do(action=", _click("Home", 5)) == (False, False)  # malformed
  assert step_accuracy.same_action(FMT, STOP, STOP) == (True, True)


def test_tallies_count_steps_by_family_and_kind_and_episodes_whose_every_step_is_right():
  def episode(k, family, steps):
    task = Task(id=f"t{k}", intent="i", site="shop", start_url="u", meta={"family": family})
    return Trajectory(task=task, success=1.0, steps=[Step(step=i, obs_text=f"page {k}.{i}", action_text=want)
                                                     for i, want in enumerate(steps)])
  trajs = [episode(0, "cart", [_click("Home", 5), STOP]), episode(1, "reply", [_click("Home", 5), _type("Hi", 9), STOP])]
  replies = [_click("Home", 5), STOP, _click("Home", 5), _type("Ho", 9), STOP]  # the step samples' order
  tally, records = step_accuracy.tally(FMT, trajs, replies)
  assert tally["all"] == {"steps": 5, "right": 4, "element": 5, "episodes": 2, "episodes_right": 1}
  assert tally["cart"]["episodes_right"] == 1 and tally["reply"]["episodes_right"] == 0
  assert tally["type"] == {"steps": 1, "right": 0, "element": 1}
  assert tally["click"]["steps"] == 2 and tally["stop"]["right"] == 2
  assert [r["right"] for r in records] == [True, True, True, False, True]
  assert "| all | 5 | 4 (80.0 %) | 5 (100.0 %) | 1 (50.0 %) |" in step_accuracy.table(tally)


def test_paired_counts_each_intent_once_and_pairs_the_same_steps():
  expert = {"a-0": _click("Home", 5), "a-1": STOP, "b-0": _click("Home", 5), "b-1": _type("Hi", 9), "b-2": STOP}
  rec = lambda rights: {k: {"expert": e, "right": r} for (k, e), r in zip(expert.items(), rights)}
  worse, better = rec([0, 1, 0, 0, 1]), rec([1, 1, 1, 1, 1])
  out = step_accuracy.paired([(worse, better)], resamples=200)
  # intent a: 1/2 -> 1, intent b: 1/3 -> 1; each intent counts once
  assert abs(out["all"]["a"] - (1 / 2 + 1 / 3) / 2) < 1e-9 and out["all"]["b"] == 1.0
  assert abs(out["all"]["mean"] - (1 / 2 + 2 / 3) / 2) < 1e-9 and out["all"]["episodes"] == [2]
  assert out["type"]["episodes"] == [1] and out["type"]["mean"] == 1.0 and out["stop"]["mean"] == 0.0
  with pytest.raises(ValueError, match="different steps"):
    step_accuracy.paired([(worse, {k: v for k, v in better.items() if k != "b-2"})])


def test_step_records_read_the_same_gzipped_as_plain(tmp_path):
  import gzip
  import json
  lines = "".join(json.dumps({"id": f"a-{k}", "expert": STOP, "right": bool(k % 2)}) + "\n" for k in range(3))
  (tmp_path / "steps.jsonl").write_text(lines, encoding="utf-8")
  with gzip.open(tmp_path / "steps.jsonl.gz", "wt", encoding="utf-8") as f:
    f.write(lines)
  plain = step_accuracy.read_records(str(tmp_path / "steps.jsonl"))
  assert step_accuracy.read_records(str(tmp_path / "steps.jsonl.gz")) == plain and list(plain) == ["a-0", "a-1", "a-2"]
