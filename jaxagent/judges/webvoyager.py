"""WebVoyager's auto-evaluation (MinorJerry/WebVoyager:evaluation/auto_eval.py), OpenWebVoyager's judge: the task,
the agent's answer and its last k screenshots go to the model, whose reply says SUCCESS or NOT SUCCESS.

The request is the system prompt, then one user message `TASK: <task>\\nResult Response: <answer>\\n<num> screenshots
at the end: ` + the last k screenshots + `Your verdict:\\n` (temperature 0, seed 42, max_tokens 1000). 'NOT SUCCESS'
in the reply -> 0, else 'SUCCESS' -> 1, else unjudged (OpenWebVoyager maps that to 0; we keep it visible). A
trajectory whose last step is not an ANSWER scores 0 without a call, as the original. `<num>` is k itself, not the
number of screenshots attached (the original's behaviour).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from jaxagent.agents import base as fmt_base
from jaxagent.agents import webvoyager_prompts as P
from jaxagent.types import ActionKind, Task, Trajectory, Verdict


def webvoyager_messages(task: str, answer: str, images: Sequence[Any], img_num: int) -> list[fmt_base.Message]:
  user = (P.AUTO_EVAL_USER_PROMPT.replace("<task>", task).replace("<answer>", answer).replace("<num>", str(img_num)))
  content = [fmt_base.text_part(user)] + [fmt_base.image_part(i) for i in images]
  content.append(fmt_base.text_part(P.AUTO_EVAL_VERDICT_PROMPT))
  return [{"role": "system", "content": P.AUTO_EVAL_SYSTEM_PROMPT}, {"role": "user", "content": content}]


def _has_verdict(reply: str) -> bool:
  """Whether a reply holds a verdict: only such replies are cached, so a bad one is asked again."""
  return "SUCCESS" in reply  # NOT SUCCESS included


def parse_webvoyager_verdict(reply: str) -> Verdict:
  if "NOT SUCCESS" in reply:
    return Verdict(0.0, "judge: NOT SUCCESS")
  if "SUCCESS" in reply:
    return Verdict(1.0, "judge: SUCCESS")
  return Verdict(None, f"judge reply has neither SUCCESS nor NOT SUCCESS: {reply[-200:]!r}")


def final_answer(trajectory: Trajectory) -> str | None:
  """The answer of an episode that ended with ANSWER, else None (WebVoyager then scores 0)."""
  last = trajectory.steps[-1] if trajectory.steps else None
  if last is not None and last.action is not None and last.action.kind == ActionKind.ANSWER:
    return last.action.text.strip()
  if trajectory.answer:
    return trajectory.answer.strip()
  return None


def judge(complete: Callable[..., str], task: Task, trajectory: Trajectory, max_attached_imgs: int = 3,
          image_root: str = "") -> Verdict:
  """The episode's verdict, asking `complete(messages, keep=)` about its last `max_attached_imgs` stored screenshots
  (relative to `image_root`); raises what `complete` raises when no reply can be had."""
  answer = final_answer(trajectory)
  if answer is None:
    return Verdict(0.0, "no ANSWER at the end of the trajectory (WebVoyager's auto_eval scores 0 without asking)")
  k = max_attached_imgs
  paths = [s.image_path for s in trajectory.steps if s.image_path][-k:]
  images = [p if os.path.isabs(p) or not image_root else os.path.join(image_root, p) for p in paths]
  return parse_webvoyager_verdict(complete(webvoyager_messages(task.intent, answer, images, k), keep=_has_verdict))
