"""data_tools/paired_probes.py: two bases' probe replies scored as the recipe scores them, paired probe by probe."""

import json
import os

import pytest

from data_tools import paired_probes

CLICK = '# Note: I will click "Lamps".\ndo(action="Click", element="{}")'
TYPE = '# Note: I will type "{0}" into the field.\ndo(action="Type", argument="{0}", element="{1}")'
SAY = '# Note: The task is complete.\nexit(message="{}")'


def _probe(k, skill, want, element="", text=""):
  return {"id": f"probe-{k}", "images": [], "skill": skill, "element": element, "text": text, "style": "straight",
          "conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": want}]}


PROBES = [_probe(0, "click", CLICK.format(7), element="7"),
          _probe(1, "click", CLICK.format(9), element="9"),
          _probe(2, "type", TYPE.format("zovu quin", 3), element="3", text="zovu quin"),
          _probe(3, "say", SAY.format("ka94"), text="ka94")]


def _workdir(root, name, replies):
  w = os.path.join(root, name)
  os.makedirs(os.path.join(w, "corpus"))
  os.makedirs(os.path.join(w, "probes"))
  with open(os.path.join(w, "corpus", "probes.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(p) + "\n" for p in PROBES)
  with open(os.path.join(w, "probes", "replies.json"), "w", encoding="utf-8") as f:
    json.dump([{"id": p["id"], "skill": p["skill"], "reply": r, "want": p["conversations"][1]["value"]}
               for p, r in zip(PROBES, replies)], f)
  return w


def test_each_probe_is_scored_as_the_recipe_scores_it(tmp_path):
  w = _workdir(tmp_path, "a", [CLICK.format(7), CLICK.format(8), TYPE.format("zovu quinn", 3), "no action"])
  s = paired_probes.scored(w)
  assert s["probe-0"] == {"skill": "click", "want": CLICK.format(7), "grounding": 1.0, "exact": 1.0}
  assert s["probe-1"]["grounding"] == 0.0
  assert (s["probe-2"]["grounding"], s["probe-2"]["copy"], s["probe-2"]["exact"]) == (1.0, 0.0, 0.0)
  assert s["probe-2"]["run_on"] == 1.0  # "zovu quinn" goes on past "zovu quin"
  assert s["probe-3"]["copy"] == 0.0 and s["probe-3"]["run_on"] == 0.0 and "grounding" not in s["probe-3"]
  assert "run_on" not in s["probe-0"]


def test_the_difference_is_b_minus_a_on_the_same_probes(tmp_path):
  a = paired_probes.scored(_workdir(tmp_path, "a", [CLICK.format(7), CLICK.format(8), TYPE.format("x", 3), "-"]))
  b = paired_probes.scored(_workdir(tmp_path, "b", [CLICK.format(7), CLICK.format(9), TYPE.format("zovu quin", 3),
                                                    SAY.format("ka94")]))
  result = paired_probes.paired(a, b, resamples=200)
  assert result["all"]["grounding"]["n"] == 3 and result["all"]["copy"]["n"] == 2
  assert result["all"]["grounding"]["a"] == pytest.approx(2 / 3) and result["all"]["grounding"]["b"] == 1.0
  assert result["all"]["copy"]["mean"] == pytest.approx(1.0)
  assert result["click"]["grounding"]["mean"] == pytest.approx(0.5)
  assert "| all | grounding | 3 |" in paired_probes.table(result)
  assert paired_probes.paired(a, a, resamples=200)["all"]["exact"]["mean"] == 0.0


def test_runs_with_different_probes_are_refused(tmp_path):
  a = paired_probes.scored(_workdir(tmp_path, "a", [CLICK.format(7)] * 4))
  b = dict(a)
  b["probe-0"] = {**b["probe-0"], "want": CLICK.format(5)}
  with pytest.raises(ValueError, match="different probes"):
    paired_probes.paired(a, b)
  with pytest.raises(FileNotFoundError, match="probes stage"):
    paired_probes.scored(str(tmp_path / "nowhere"))
