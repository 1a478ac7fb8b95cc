"""The critic-ranking check on hand-built trajectories: state matching, tap tolerance, argmax vs chance."""

import numpy as np

from data_tools import critic_ranking
from jaxagent.types import Step, Task, Trajectory


def _tap(x, y):
  return (f'Action Plan: [DUAL_POINT] ; Action Decision: "action_type": "DUAL_POINT", "touch_point": "[{x}, {y}]", '
          f'"lift_point": "[{x}, {y}]", "typed_text": ""')


DONE = ('Action Plan: [STATUS_TASK_COMPLETE] ; Action Decision: "action_type": "STATUS_TASK_COMPLETE", '
        '"touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": ""')
TASK = Task(id="t", intent="open office", site="shop", start_url="u")


def _traj(session, steps, success=1.0):
  return Trajectory(task=TASK, success=success, steps=[
      Step(step=k, url=f"http://127.0.0.1:9/s/{session}/{url}", obs_text=prompt, action_text=action,
           candidates=cands) for k, (url, prompt, action, cands) in enumerate(steps)])


def test_ranking_report_against_the_expert():
  demo = _traj("a", [("launcher/", "p0", _tap(0.2, 0.16), None), ("shop/", "p1", _tap(0.15, 0.28), None),
                     ("shop/c/office", "p2", DONE, None)])
  garbled = _tap(0.15, 0.28).replace('"lift_point": "[0.15, 0.28]"', '"lift_point": "[0.28]"')
  behaviour = _traj("b", [
      ("launcher/", "p0", _tap(0.2, 0.16), [_tap(0.2, 0.16), _tap(0.21, 0.165), _tap(0.9, 0.9), "garbage"]),
      # the category step: the dataset tap misses; candidate 1 is within tolerance, 2 is far, 3 is garbled
      ("shop/", "p1", _tap(0.15, 0.5), [_tap(0.15, 0.5), _tap(0.16, 0.285), _tap(0.5, 0.28), garbled]),
      ("shop/", "p-unseen", DONE, [DONE] * 4),  # no demonstration visited this state: skipped
  ], success=0.0)
  rows = np.array([[0, 0], [0, 1], [0, 2]])
  valid = np.array([[True, True, True, False], [True, True, True, False], [True, True, True, False]])
  q = np.array([[0.1, 0.2, 0.9, 0.0], [0.1, 0.8, 0.3, 5.0], [0.0, 0.0, 0.0, 0.0]])
  q = np.stack([q, q - 1.0], -1)  # two heads; the report takes their max
  report = critic_ranking.ranking_report([demo], [behaviour], rows, q, valid)
  assert set(report) == {0, 1}
  # launcher: argmax picks the far tap (0.9, 0.9); the dataset tap matches; 2 of 3 valid candidates match
  # (each state was visited once: the lookup table has no other visit and keeps the dataset action)
  assert report[0] == {"states": 1, "argmax_q": 0.0, "dataset": 1.0, "random_valid": 2 / 3, "lookup": 1.0,
                       "any_valid": 1.0}
  # category: the garbled candidate's high Q is ignored (invalid); argmax = the tap within tolerance
  assert report[1] == {"states": 1, "argmax_q": 1.0, "dataset": 0.0, "random_valid": 1 / 3, "lookup": 0.0,
                       "any_valid": 1.0}


def test_lookup_table_leaves_the_row_out():
  demo = _traj("d", [("shop/", "p1", _tap(0.15, 0.28), None)])
  right, wrong, far = _tap(0.15, 0.28), _tap(0.15, 0.5), _tap(0.9, 0.9)
  behaviour = [_traj("a", [("shop/", "p1", right, [right, wrong])], success=1.0),
               _traj("b", [("shop/", "p1", wrong, [wrong, right])], success=0.0),
               _traj("c", [("shop/", "p1", wrong, [wrong, far])], success=0.0),
               _traj("e", [("shop/", "p-other", right, [right, wrong])], success=1.0)]  # another state
  rows = np.array([[0, 0], [1, 0], [2, 0], [3, 0]])
  values = critic_ranking.lookup_values(behaviour, rows)
  # a: its own success is left out; b and c (both failures, both "wrong") are the others → 0 for both
  # b: "wrong" was c's action (failed) → 0; "right" was a's (succeeded) → 1
  # c: "wrong" → b's failure, 0; "far" was never taken → the others' mean (a 1, b 0) = 0.5
  # e: no other visit to its state → 0 for every candidate
  np.testing.assert_allclose(values, [[0, 0], [0, 1], [0, 0.5], [0, 0]])
  valid = np.ones((4, 2), bool)
  report = critic_ranking.ranking_report([demo], behaviour, rows, np.zeros((4, 2)), valid)
  # the expert taps "right" at p1; the lookup picks it at a (tie → dataset) and b, "far" at c
  assert report[0]["states"] == 3
  assert report[0]["lookup"] == 2 / 3 and report[0]["dataset"] == 1 / 3 and report[0]["any_valid"] == 2 / 3


def test_same_action_tolerance_and_types():
  assert critic_ranking.same_action(_tap(0.5, 0.5), _tap(0.52, 0.51))
  assert not critic_ranking.same_action(_tap(0.5, 0.5), _tap(0.5, 0.52))  # y tolerance 0.015
  assert not critic_ranking.same_action(DONE, _tap(0.5, 0.5))
  assert critic_ranking.same_action(DONE, DONE)


def test_selection_report_counts_only_the_states_best_of_n_keeps():
  demo = _traj("d", [("launcher/", "p0", _tap(0.2, 0.16), None), ("shop/", "p1", _tap(0.15, 0.28), None)])
  right, wrong = _tap(0.15, 0.28), _tap(0.15, 0.5)
  behaviour = [_traj("a", [("launcher/", "p0", _tap(0.2, 0.16), [_tap(0.2, 0.16), _tap(0.9, 0.9)]),
                           ("shop/", "p1", wrong, [wrong, right])], success=0.0),
               _traj("b", [("shop/", "p1", wrong, [wrong, right])], success=0.0),
               _traj("c", [("shop/", "p1", right, [right, wrong])], success=1.0)]
  rows = np.array([[0, 0], [0, 1], [1, 0], [2, 0]])
  valid = np.ones((4, 2), bool)
  q = np.array([[0.3, 0.9], [0.1, 0.6], [0.5, 0.2], [0.7, 0.1]])
  v = np.array([0.5, 0.3, 0.45, 0.5])
  # advantages of the best candidate: 0.4 (launcher, the far tap), 0.3 (a: "right"), 0.05 (b: under the
  # threshold, dropped), 0.2 (c: the dataset's "right")
  report = critic_ranking.selection_report([demo], behaviour, rows, q, v, valid, threshold=0.1)
  assert report == {0: {"selected": 1, "picked": 0.0, "dataset": 1.0},
                    1: {"selected": 2, "picked": 1.0, "dataset": 0.5}}
  assert critic_ranking.selection_report([demo], behaviour, rows, q, v, valid, threshold=0.5) == {}


def test_main_says_why_when_no_behaviour_state_is_a_demonstration_state(tmp_path, capsys):
  from jaxagent.data.store import TrajectoryStore
  TrajectoryStore(str(tmp_path / "il" / "demos")).append(_traj("a", [("shop/", "goal A", _tap(0.1, 0.2), None)]))
  TrajectoryStore(str(tmp_path / "candidates" / "store")).append(
      _traj("b", [("shop/", "goal B", _tap(0.1, 0.2), [_tap(0.1, 0.2)] * 2)], success=0.0))
  (tmp_path / "critic").mkdir()
  np.savez(tmp_path / "critic" / "scores.npz", rows=np.array([[0, 0]]), q=np.zeros((1, 2, 2)), v=np.zeros((1, 2)),
           valid=np.ones((1, 2), bool))
  assert critic_ranking.main(["--workdir", str(tmp_path)]) == 1
  assert "behaviour.splits=train,test" in capsys.readouterr().err
