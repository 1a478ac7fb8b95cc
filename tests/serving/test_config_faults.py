"""Fault injections: a training workdir whose config.json is damaged or incomplete is refused with an error
naming the file and the key, not a bare JSON/attribute error."""

import json
import os

import pytest

from jaxagent.main import load_config_file
from jaxagent.serving.checkpoint import load_policy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _good():
  return json.loads(load_config_file(f"{ROOT}/configs/il.py:smoke").to_json_best_effort())


def _without(d, dotted):
  d = json.loads(json.dumps(d))
  *parents, leaf = dotted.split(".")
  node = d
  for p in parents:
    node = node[p]
  del node[leaf]
  return d


def _with(d, dotted, value):
  d = json.loads(json.dumps(d))
  *parents, leaf = dotted.split(".")
  node = d
  for p in parents:
    node = node[p]
  node[leaf] = value
  return d


CASES = {
    "not json": (lambda: "model: vlm\n", r"not valid JSON at line 1, column 1"),
    "truncated": (lambda: json.dumps(_good(), indent=2)[:300], r"not valid JSON at line \d+"),
    "a list": (lambda: "[1, 2]", r"holds a JSON list"),
    "no model": (lambda: json.dumps(_without(_good(), "model")), r"missing key 'model'"),
    "no train.steps": (lambda: json.dumps(_without(_good(), "train.steps")), r"missing key 'train.steps'"),
    "steps a string": (lambda: json.dumps(_with(_good(), "train.steps", "ten")), r"train.steps is 'ten' \(str\)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_workdir_config_is_refused_naming_file_and_key(tmp_path, case):
  text, message = CASES[case]
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text(text())
  with pytest.raises(ValueError, match=message) as e:
    load_policy(str(tmp_path))
  assert str(tmp_path / "config.json") in str(e.value)
