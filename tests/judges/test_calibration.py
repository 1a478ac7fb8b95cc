"""Judge calibration: agreement figures against hand-computed values, and the command end to end over a real
TrajectoryStore judged by a real local OpenAI-compatible server (`openai_peer.py`, canned verdicts)."""

import json

import numpy as np
import pytest

from jaxagent.data.store import TrajectoryStore
from jaxagent.judges import calibration
from jaxagent.types import Action, ActionKind, Observation, Step, Task, Trajectory
from openai_peer import Peer


def test_agreement_matches_hand_computed_values():
  reference = [1, 1, 1, 0, 0, 0, 1, 0, 1, 0]
  judged = [1, 1, 0, 0, 1, 0, 1, None, 1, 0]
  m = calibration.agreement(reference, judged)
  # judged 9: reference failure -> judge (failure 3, success 1); reference success -> (failure 1, success 4)
  assert m["confusion"]["matrix"] == [[3, 1], [1, 4]]
  assert (m["total"], m["judged"], m["unjudged"]) == (10, 9, 1)
  assert m["accuracy"] == pytest.approx(7 / 9)
  # p_o = 63/81, p_e = (5/9)(5/9) + (4/9)(4/9) = 41/81, kappa = (63 - 41) / (81 - 41) = 0.55
  assert m["cohen_kappa"] == pytest.approx(0.55)
  assert m["reference_success_rate"] == pytest.approx(0.5) and m["judge_success_rate"] == pytest.approx(5 / 9)


def test_agreement_edge_cases():
  perfect = calibration.agreement([1, 0, 1], [1.0, 0.0, 1.0])
  assert perfect["accuracy"] == 1.0 and perfect["cohen_kappa"] == pytest.approx(1.0)
  constant = calibration.agreement([1, 1], [1.0, 1.0])  # p_e = 1: kappa is undefined, not 0 or 1
  assert constant["accuracy"] == 1.0 and constant["cohen_kappa"] is None
  chance = calibration.agreement([1, 0, 1, 0], [1, 1, 0, 0])  # agreement no better than chance
  assert chance["cohen_kappa"] == pytest.approx(0.0)
  none = calibration.agreement([1, 0], [None, None])
  assert none["judged"] == 0 and none["accuracy"] is None and none["unjudged"] == 2
  with pytest.raises(ValueError, match="reference labels"):
    calibration.agreement([1], [1, 0])


def _traj(i, answer, success, status="completed"):
  task = Task(id=f"t{i}", intent=f"Find item {i}", site="shop", start_url="http://127.0.0.1/")
  shot = np.full((16, 16, 3), i * 20, np.uint8)
  steps = [Step(step=0, action=Action(ActionKind.CLICK, element=1), observation=Observation(screenshot=shot))]
  last = Action(ActionKind.ANSWER, text=answer) if answer is not None else Action(ActionKind.CLICK, element=2)
  steps.append(Step(step=1, action=last, observation=Observation(screenshot=shot[::-1].copy())))
  return Trajectory(task=task, steps=steps, success=success, status=status, answer=answer or "")


def test_calibration_command_over_a_store(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXAGENT_TEST_KEY", "sk-calibration-test-000000")
  store = TrajectoryStore(tmp_path / "store")
  # (answer, programmatic verdict); the peer says SUCCESS for "correct", NOT SUCCESS for "wrong", neither for
  # "maybe"; no ANSWER scores 0 without a call (WebVoyager's auto_eval).
  rows = [("correct", 1.0), ("correct", 1.0), ("wrong", 1.0), ("wrong", 0.0), ("correct", 0.0), (None, 0.0),
          ("maybe", 1.0)]
  for i, (answer, success) in enumerate(rows):
    store.append(_traj(i, answer, success))
  store.append(_traj(7, "correct", 1.0, status="errored"))  # skipped: the episode crashed
  store.append(_traj(8, "correct", None))  # skipped: no reference verdict
  out = tmp_path / "report.json"
  with Peer() as peer:
    code = calibration.main(["--store", str(tmp_path / "store"), "--base-url", peer.base_url, "--model", "judge",
                             "--api-key-env", "JAXAGENT_TEST_KEY", "--json", str(out)])
    assert code == 0
    bodies = list(peer.state.bodies)
  report = json.loads(out.read_text())
  m = report["metrics"]
  # judged 6: reference failure -> (failure 2, success 1), reference success -> (failure 1, success 2)
  assert m["confusion"]["matrix"] == [[2, 1], [1, 2]]
  assert (m["total"], m["judged"], m["unjudged"]) == (7, 6, 1)
  assert m["accuracy"] == pytest.approx(4 / 6) and m["cohen_kappa"] == pytest.approx(1 / 3)
  assert [d["task"] for d in report["disagreements"]] == ["t2", "t4"]
  assert report["unjudged_reasons"][0]["task"] == "t6"
  assert len(bodies) == 6  # the no-ANSWER trajectory cost no call
  # the judge saw the stored screenshots (resolved against the store) as base64 images
  assert all(any(p.get("type") == "image_url" for p in b["messages"][1]["content"]) for b in bodies)
  assert report["judge_stats"]["verdicts"] == {"success": 3, "failure": 3, "unjudged": 1}


def test_calibrate_needs_labelled_trajectories():
  with pytest.raises(ValueError, match="known verdict"):
    calibration.calibrate(object(), [_traj(0, "x", None)])
