"""DigiRL's per-step LLM judge (DigiRL-agent/digirl:digirl/environment/android/evaluate.py): after every step, the
task and the new screenshot (downscaled 4x) ask the model for `Status: success|failure`; the first success ends the
episode with reward 1. `step_rewards` gives the per-step rewards, `episode_verdict` the episode's.

A step is skipped without a call (reward 0) when the screen did not change (pixel MSE < 0.001·255²) or matches one
of the first 5 judged screens (the original's cache of up to 5). The prompt is the original's few-shot one
(`LLMJudgeConfig.digirl_task_set`, exemplars in `digirl_prompts`): "general" (`build_prompt_general`, 9 exemplars)
or "webshop" (`build_prompt_webshop`, 11 exemplars), laid out as `call_gemini` lays out its parts:
`<system>\\n=====Examples=====`, then per exemplar `\\nScreenshot:`, the image, the text; then `=====Your Turn=====`,
`\\nScreenshot: `, the current screenshot, the final instruction. "zero_shot" is our earlier simplified prompt
(system text, the "Your Turn" block and the current screenshot only).

Departures: (1) an OpenAI-compatible chat model instead of Gemini-1.5-Pro: the Gemini content list becomes the parts
of one user message, one part per Gemini part, in order (no system role, as the original has none); (2) the current
screenshot is converted to RGB before the 4x downscale (the original keeps the file's mode, RGBA on Android, whose
alpha is opaque); (3) the image cache is per trajectory (the original shares it across emulators, which DigiRL issue
#25 reports as a bug); (4) a task_set other than the two is an error here (the original fails with
UnboundLocalError); (5) a reply without `Status:`, or a call that fails, leaves the step unjudged (the original
scores it 0), and so is an episode with such a step and no judged success.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any, Callable

import numpy as np
from PIL import Image

from jaxagent import openai_client
from jaxagent.agents import base as fmt_base
from jaxagent.judges.digirl_prompts import DIGIRL_EXEMPLARS, DIGIRL_SYSTEM, DIGIRL_TASK_SETS, DIGIRL_YOUR_TURN
from jaxagent.types import Task, Trajectory, Verdict

UNCHANGED_MSE = 0.001 * 255 ** 2  # below this pixel MSE two screens are the same screen
SEEN_SCREENS = 5  # the original's cache of judged screens

_STATUS = re.compile(r"Status:\s*(\w+)")


def digirl_messages(intent: str, image: Any, task_set: str = "general") -> list[fmt_base.Message]:
  """DigiRL's evaluator prompt for `task_set` ("general" | "webshop": the few-shot prompts; "zero_shot": the
  simplified one), as one OpenAI user message whose parts are `call_gemini`'s, in order (module docstring)."""
  your_turn = fmt_base.text_part(DIGIRL_YOUR_TURN.format(intent=intent))
  if task_set == "zero_shot":
    return [{"role": "user", "content": [
        fmt_base.text_part(DIGIRL_SYSTEM + "\n" + "=====Your Turn=====" + "\nScreenshot: "),
        fmt_base.image_part(image),
        your_turn]}]
  if task_set not in DIGIRL_EXEMPLARS:
    raise ValueError(f"DigiRL task_set {task_set!r} is unknown; allowed values: "
                     + ", ".join(repr(t) for t in DIGIRL_TASK_SETS))
  content = [fmt_base.text_part(DIGIRL_SYSTEM + "\n" + "=====Examples=====")]
  for ex in DIGIRL_EXEMPLARS[task_set]:
    content += [fmt_base.text_part("\nScreenshot:"), fmt_base.image_part(ex.image_path), fmt_base.text_part(ex.text)]
  content += [fmt_base.text_part("=====Your Turn====="), fmt_base.text_part("\nScreenshot: "),
              fmt_base.image_part(image), your_turn]
  return [{"role": "user", "content": content}]


def _has_status(reply: str) -> bool:
  """Whether a reply holds a verdict: only such replies are cached, so a bad one is asked again."""
  return _STATUS.search(reply) is not None


def parse_digirl_status(reply: str) -> Verdict:
  """The original's reading: no `Status:` is a failure (the judge itself leaves such a step unjudged)."""
  match = _STATUS.search(reply)
  if match is None:
    return Verdict(0.0, "judge reply has no 'Status:' (DigiRL counts this as failure)")
  status = match.group(1)
  return Verdict(1.0 if "success" in status.lower() else 0.0, f"judge: Status: {status}")


def _image_array(image: Any, image_root: str) -> np.ndarray:
  """An in-memory screenshot as it is, a stored one (relative to `image_root`) read as RGB."""
  if isinstance(image, np.ndarray):
    return image
  path = image if not image_root or os.path.isabs(image) else os.path.join(image_root, image)
  with Image.open(path) as im:
    return np.asarray(im.convert("RGB"))


def _screens(trajectory: Trajectory, t: int) -> tuple[Any, Any]:
  """Step t's screen before and after (a stored path, or the in-memory screenshot), None where missing."""
  steps = trajectory.steps

  def shot(obs):
    return obs.screenshot if obs is not None and obs.screenshot is not None else None

  before = steps[t].image_path or shot(steps[t].observation)
  after = steps[t].next_image_path or (shot(steps[t + 1].observation) if t + 1 < len(steps)
                                       else shot(trajectory.final_observation))
  return before, after


def _quarter(image: np.ndarray) -> bytes:
  """DigiRL's `process_image`: resize to 1/4 width and height, as PNG."""
  im = Image.fromarray(image)
  im = im.resize((max(1, im.width // 4), max(1, im.height // 4)))
  buf = io.BytesIO()
  im.save(buf, format="PNG")
  return buf.getvalue()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
  return a.shape == b.shape and np.mean((a - b) ** 2) < UNCHANGED_MSE


def _ask(complete: Callable[..., str], intent: str, screen: np.ndarray, task_set: str) -> Verdict:
  """The model's status for one new screen; unjudged (never a guessed 0) when no reply with `Status:` comes."""
  try:
    reply = complete(digirl_messages(intent, _quarter(screen), task_set), keep=_has_status)
  except openai_client.CompletionUnavailable as e:
    return Verdict(None, f"unjudged: {e}")
  if not _has_status(reply):
    return Verdict(None, f"unjudged: judge reply has no 'Status:' (the original counts this as failure): "
                         f"{reply[-200:]!r}")
  return parse_digirl_status(reply)


def step_rewards(complete: Callable[..., str], task: Task, trajectory: Trajectory, task_set: str = "general",
                 image_root: str = "") -> list[Verdict]:
  """One verdict per step up to the first success (which ends the episode), asking `complete(messages, keep=)`.

  A step the judge could not be asked about, or whose reply has no `Status:`, is `Verdict(None, reason)`
  (its reply is not cached, so judging again asks again); later steps are still judged. A 0.0 is either the judge's
  failure status or a skipped screen (unchanged or seen before). The screens are the stored ones
  (`Step.image_path` / `next_image_path`, relative to `image_root`) or, for an episode the collector is judging
  before it is stored, the in-memory observations. Raises ValueError naming the field when a step has neither.
  """
  seen: list[np.ndarray] = []
  out: list[Verdict] = []
  for t in range(len(trajectory.steps)):
    before, after = _screens(trajectory, t)
    if before is None or after is None:
      raise ValueError(f"step {t} lacks Step.image_path / Step.next_image_path (DigiRL judges each new screen)")
    prev = _image_array(before, image_root).astype(np.float64)
    cur_u8 = _image_array(after, image_root)
    cur = cur_u8.astype(np.float64)
    if _same(prev, cur):
      out.append(Verdict(0.0, f"step {t}: screen unchanged"))
      continue
    if any(_same(s, cur) for s in seen):
      out.append(Verdict(0.0, f"step {t}: screen seen before"))
      continue
    verdict = _ask(complete, task.intent, cur_u8, task_set)
    if verdict.success is not None and len(seen) < SEEN_SCREENS:  # an unjudged screen seen again is asked again
      seen.append(cur)
    out.append(Verdict(verdict.success, f"step {t}: {verdict.reason}"))
    if verdict.success == 1.0:
      break
  return out


def episode_verdict(steps: list[Verdict]) -> Verdict:
  """The episode's verdict from its step rewards: a judged success wins, else an unjudged step leaves it unjudged."""
  reason = "; ".join(v.reason for v in steps) or "no steps"
  if any(v.success == 1.0 for v in steps):
    return Verdict(1.0, steps[-1].reason)
  if any(v.success is None for v in steps):
    return Verdict(None, reason)
  return Verdict(0.0, reason)
