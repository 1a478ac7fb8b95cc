"""Programmatic judge wiring: evaluators first, the LLM judge where they cannot decide (real local server)."""

import numpy as np
import pytest

from jaxagent.agents import base
from jaxagent.judges import programmatic
from jaxagent.judges.evaluators import ProgrammaticJudge
from jaxagent.judges.llm import LLMJudge, LLMJudgeConfig
from jaxagent.types import Action, ActionKind, Step, Task, Trajectory
from openai_peer import Peer, PeerState


def _traj(tmp_path, answer, evaluator):
  (tmp_path / "s.png").write_bytes(base.png_bytes(np.zeros((4, 4, 3), np.uint8)))
  task = Task(id="q", intent="What does the cheapest speaker cost?", site="shop", start_url="/", evaluator=evaluator)
  steps = [Step(step=0, action=Action(ActionKind.ANSWER, text=answer), image_path="s.png")]
  return task, Trajectory(task=task, steps=steps)


def _llm(peer, tmp_path, **kw):
  return LLMJudge(LLMJudgeConfig(base_url=peer.base_url, api_key_env="JAXAGENT_NO_SUCH_KEY", image_root=str(tmp_path),
                                 backoff_initial_s=0.01, backoff_max_s=0.02, max_retries=1, **kw))


def test_programmatic_first_llm_when_no_evaluator(tmp_path):
  with Peer() as peer:
    llm = _llm(peer, tmp_path)
    judge = programmatic.FallbackJudge([programmatic.programmatic_judge(llm), llm])
    v = judge.evaluate(*_traj(tmp_path, "$12.99", {"kind": "string_match", "exact_match": "$12.99"}))
    assert v.success == 1.0 and "exact_match" in v.reason and not peer.state.bodies  # no API call needed
    v = judge.evaluate(*_traj(tmp_path, "it is correct: $12.99", {}))
    assert v.success == 1.0 and "has no evaluator spec" in v.reason and "judge: SUCCESS" in v.reason
    assert len(peer.state.bodies) == 1


def test_fuzzy_match_through_the_llm(tmp_path):
  with Peer() as peer:
    judge = programmatic.programmatic_judge(_llm(peer, tmp_path))
    spec = {"kind": "string_match", "fuzzy_match": ["12.99 dollars"]}
    assert judge.evaluate(*_traj(tmp_path, "It costs 12.99 dollars.", spec)).success == 1.0
    assert judge.evaluate(*_traj(tmp_path, "It costs 15 dollars.", spec)).success == 0.0
    user = peer.state.bodies[0]["messages"][1]["content"]
    assert user.startswith("Help a teacher to grade the answer of a student given a question.")
    assert "\nreference answer: 12.99 dollars\n" in user and user.endswith("correct/incorrect/partially correct.")
  assert ProgrammaticJudge().evaluate(*_traj(tmp_path, "x", spec)).success is None  # no judge: unjudged


def test_unreachable_llm_leaves_the_trajectory_unjudged_with_reasons(tmp_path):
  with Peer(PeerState(fault_rate=1.0, faults=["500"])) as peer:
    llm = _llm(peer, tmp_path)
    judge = programmatic.FallbackJudge([programmatic.programmatic_judge(llm), llm])
    v = judge.evaluate(*_traj(tmp_path, "correct", {}))
    assert v.success is None
    assert "has no evaluator spec" in v.reason and "gave up after 2 attempts; last error 5xx" in v.reason
    # The fuzzy path: the LLM's failure inside the evaluator is unjudged too, not a crash.
    v = judge.evaluate(*_traj(tmp_path, "x", {"kind": "string_match", "fuzzy_match": ["y"]}))
    assert v.success is None and "unjudged" in v.reason


def test_make_judge(monkeypatch):
  assert isinstance(programmatic.make_judge({"kind": "programmatic"}), ProgrammaticJudge)
  combined = programmatic.make_judge({"kind": "programmatic+llm", "llm": {"model": "m", "cache_dir": ""}})
  assert isinstance(combined, programmatic.FallbackJudge) and isinstance(combined.judges[1], LLMJudge)
  assert programmatic.make_judge({"kind": "llm", "llm": {"protocol": "digirl"}}).config.protocol == "digirl"
  with pytest.raises(ValueError, match="judge kind 'gpt' is unknown"):
    programmatic.make_judge({"kind": "gpt"})
  with pytest.raises(ValueError, match="protocol 'x' is unknown"):
    programmatic.make_judge({"kind": "llm", "llm": {"protocol": "x"}})


def test_configs_come_from_ml_collections():
  import ml_collections  # pylint: disable=g-import-not-at-top

  cfg = ml_collections.ConfigDict({"kind": "programmatic+llm", "llm": {"model": "m", "max_attached_imgs": 15}})
  judge = programmatic.make_judge(cfg)
  assert judge.judges[1].config.max_attached_imgs == 15 and judge.judges[1].config.model == "m"
