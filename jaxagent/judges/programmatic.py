"""The task's own evaluators as a `Judge`, and the combinations recipes use.

`jaxagent/judges/evaluators.py` (the WebArena-style checks: string/url/state match) holds the
`ProgrammaticJudge`; this module is where recipes get judges from:
  * `programmatic_judge(llm=None)`: the evaluators, with an LLM judging WebArena's `fuzzy_match`
    string checks when one is given (`llm_fuzzy_match`);
  * `FallbackJudge([a, b, ...])`: the first judge that returns a verdict (not `None`) decides, e.g. the
    programmatic judge first and an LLM judge for tasks without an evaluator spec;
  * `make_judge(config)`: one of "programmatic" | "llm" | "programmatic+llm" from a config dict.
"""

from __future__ import annotations

from typing import Any, Sequence

from jaxagent.judges.evaluators import FuzzyJudge, ProgrammaticJudge
from jaxagent.judges.llm import JudgeUnavailable, LLMJudge, LLMJudgeConfig
from jaxagent.types import Judge, Task, Trajectory, Verdict

# WebArena's llm_fuzzy_match prompt, verbatim (web-arena-x/webarena:evaluation_harness/helper_functions.py, as
# vendored by WebArena-derived repositories): the grader answers "correct", "incorrect" or "partially correct".
FUZZY_MESSAGE = ("Help a teacher to grade the answer of a student given a question. Keep in mind that the student may "
                 "use different phrasing or wording to answer the question. The goal is to evaluate whether the answer "
                 "is semantically equivalent to the reference answer.\nquestion: {intent}\nreference answer: "
                 "{reference}\nall the string 'N/A' that you see is a special sequence that means 'not achievable'\n"
                 "student answer: {prediction}\nConclude the judgement by correct/incorrect/partially correct.")


def llm_fuzzy_match(llm: LLMJudge) -> FuzzyJudge:
  """A `fuzzy(intent, reference, prediction) -> score` for the evaluators, asking `llm`.

  Raises `JudgeUnavailable` when the model cannot be reached; `ProgrammaticJudge.evaluate` lets that
  propagate, and `FallbackJudge` turns it into an unjudged verdict.
  """

  def fuzzy(intent: str, reference: str, prediction: str) -> float:
    reply = llm.complete([
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": FUZZY_MESSAGE.format(intent=intent, reference=reference, prediction=prediction)},
    ]).lower()
    if "partially correct" in reply or "incorrect" in reply:
      return 0.0
    return 1.0 if "correct" in reply else 0.0

  return fuzzy


def programmatic_judge(llm: LLMJudge | None = None) -> ProgrammaticJudge:
  return ProgrammaticJudge(fuzzy=llm_fuzzy_match(llm) if llm is not None else None)


class FallbackJudge:
  """Judges in order; the first verdict that is not `None` wins. Reasons of the skipped ones are kept."""

  def __init__(self, judges: Sequence[Judge]):
    if not judges:
      raise ValueError("FallbackJudge needs at least one judge")
    self.judges = list(judges)

  def evaluate(self, task: Task, trajectory: Trajectory) -> Verdict:
    reasons = []
    for judge in self.judges:
      try:
        verdict = judge.evaluate(task, trajectory)
      except JudgeUnavailable as e:
        verdict = Verdict(None, f"unjudged: {e}")
      if verdict.success is not None:
        return Verdict(verdict.success, " | ".join(reasons + [verdict.reason]))
      reasons.append(f"{type(judge).__name__}: {verdict.reason}")
    return Verdict(None, " | ".join(reasons))


def make_judge(config: dict[str, Any] | Any) -> Judge:
  """`{"kind": "programmatic" | "llm" | "programmatic+llm", "llm": {LLMJudgeConfig fields}}`."""
  d = dict(config.to_dict() if hasattr(config, "to_dict") else config)
  kind = d.get("kind", "programmatic")
  llm = LLMJudge(LLMJudgeConfig.from_config(d.get("llm", {}))) if "llm" in kind else None
  if kind == "programmatic":
    return programmatic_judge()
  if kind == "llm":
    return llm
  if kind == "programmatic+llm":
    return FallbackJudge([programmatic_judge(llm), llm])
  raise ValueError(f"judge kind {kind!r} is unknown; use 'programmatic', 'llm' or 'programmatic+llm'")


class RewardJudge:
  """The environment's own reward as the verdict: success when the episode's last reward reaches `success_at`
  (MiniWoB++'s raw reward is 1 on success, −1 on a wrong answer, 0 when the episode ran out of steps; −1 too when
  the page's own clock, if kept, ran out: `envs.miniwob`, "The clock")."""

  def __init__(self, success_at: float = 1.0):
    self.success_at = float(success_at)

  def evaluate(self, task: Task, trajectory: Trajectory) -> Verdict:
    del task
    if not trajectory.steps:
      return Verdict(0.0, "no step was taken")
    last = float(trajectory.steps[-1].reward)
    return Verdict(float(last >= self.success_at), f"the environment's last reward was {last:g}")
