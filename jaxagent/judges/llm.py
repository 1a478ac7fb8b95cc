"""LLM judges over any OpenAI-compatible endpoint: WebVoyager's auto-evaluation and DigiRL's per-step judge.

Protocols (`reference/algorithms.md` §1.5, §4.5):
  * `webvoyager` (MinorJerry/WebVoyager:evaluation/auto_eval.py): system prompt; user message
    `TASK: <task>\\nResult Response: <answer>\\n<num> screenshots at the end: ` + the last k screenshots +
    `Your verdict:\\n`; temperature 0, seed 42, max_tokens 1000. 'NOT SUCCESS' in the reply -> 0,
    else 'SUCCESS' -> 1, else unjudged (OpenWebVoyager maps that to 0; we keep it visible). A trajectory
    whose last step is not an ANSWER scores 0 without a call, as the original. `<num>` is k itself, not
    the number of screenshots attached (the original's behaviour).
  * `digirl` (DigiRL-agent/digirl:digirl/environment/android/evaluate.py): after every step, the task and
    the new screenshot (downscaled 4x) -> `Status: success|failure`; the first success ends the episode
    with reward 1 (`step_rewards` gives the per-step rewards, `evaluate` the episode's verdict).
    Skipped without a call (reward 0) when the screen did not change (pixel MSE < 0.001·255²) or matches
    one of the first 5 judged screens (the original's cache of up to 5). SIMPLIFIED: the original sends 9
    (general) / 11 (webshop) few-shot exemplars with their screenshots, which are not bundled here; we send
    the system message and the original's "Your Turn" block only. The image cache is per trajectory (the
    original shares it across emulators, which DigiRL issue #25 reports as a bug).

Robustness: requests go through `jaxagent.openai_client` (retries with exponential backoff on 429, 5xx,
timeouts, connection errors and malformed bodies; other 4xx fail at once; tokens and cost counted; keys from
`secrets.load_api_key`, every error text through `secrets.redact`), with its content-keyed on-disk cache making
re-judging free. A bounded thread pool judges many trajectories. A verdict that cannot be obtained is
`Verdict(None, reason)` (unjudged), never an exception and never a silent 0.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import os
import re
from typing import Any, Sequence

import numpy as np

from jaxagent import openai_client, secrets
from jaxagent.agents import base as fmt_base
from jaxagent.agents import webvoyager_prompts as P
from jaxagent.types import ActionKind, Task, Trajectory, Verdict


@dataclasses.dataclass
class LLMJudgeConfig:
  """Where and how to ask. No key in here: `api_key_env` / `api_key_file` say where to find it."""

  protocol: str = "webvoyager"  # "webvoyager" | "digirl"
  base_url: str = ""  # "" -> $OPENAI_BASE_URL or the OpenAI API
  model: str = "gpt-4o"
  api_key_env: str = "OPENAI_API_KEY"
  api_key_file: str = ""
  max_attached_imgs: int = 3  # k: 3 in OpenWebVoyager's exploration, 15 in WebVoyager's run_eval.sh
  max_tokens: int = 1000
  temperature: float = 0.0
  seed: int | None = 42
  timeout_s: float = 60.0
  max_retries: int = 6
  backoff_initial_s: float = 1.0
  backoff_max_s: float = 30.0
  concurrency: int = 8
  cache_dir: str = ""  # "" -> no cache
  image_root: str = ""  # where relative Step.image_path resolve (the trajectory store)
  usd_per_1k_prompt: float = 0.01  # WebVoyager's cost log
  usd_per_1k_completion: float = 0.03

  @classmethod
  def from_config(cls, cfg: Any) -> "LLMJudgeConfig":
    """From a dict or ml_collections ConfigDict; unknown keys are an error naming the valid ones."""
    return openai_client.config_from(cls, cfg, "LLM judge config")


class JudgeUnavailable(openai_client.CompletionUnavailable):
  """No usable reply could be obtained (the reason is already redacted)."""


@dataclasses.dataclass
class JudgeStats(openai_client.UsageStats):
  """The client's usage counts and the verdicts given."""

  verdicts: dict[str, int] = dataclasses.field(default_factory=dict)  # "success" | "failure" | "unjudged"


# ------------------------------------------------------------------------------------------ prompts


def webvoyager_messages(task: str, answer: str, images: Sequence[Any], img_num: int) -> list[fmt_base.Message]:
  user = (P.AUTO_EVAL_USER_PROMPT.replace("<task>", task).replace("<answer>", answer).replace("<num>", str(img_num)))
  content = [fmt_base.text_part(user)] + [fmt_base.image_part(i) for i in images]
  content.append(fmt_base.text_part(P.AUTO_EVAL_VERDICT_PROMPT))
  return [{"role": "system", "content": P.AUTO_EVAL_SYSTEM_PROMPT}, {"role": "user", "content": content}]


def parse_webvoyager_verdict(reply: str) -> Verdict:
  if "NOT SUCCESS" in reply:
    return Verdict(0.0, "judge: NOT SUCCESS")
  if "SUCCESS" in reply:
    return Verdict(1.0, "judge: SUCCESS")
  return Verdict(None, f"judge reply has neither SUCCESS nor NOT SUCCESS: {reply[-200:]!r}")


DIGIRL_SYSTEM = "You're an expert in evaluating whether the Screenshot successfully completes the Task."
DIGIRL_YOUR_TURN = ("Task: {intent}\nRespond in this format:\nQ: What should I expect to see on the screenshot if "
                    "I've <repeat the task>?\nA: I should expect to see <first expectation, then what's in the given "
                    "screenshot.>\nStatus: success or failure (don't return anything else)\nStart with \"Q:\".")


def digirl_messages(intent: str, image: Any) -> list[fmt_base.Message]:
  """The simplified zero-shot DigiRL prompt (see the module docstring): system text, "Your Turn" block."""
  return [{"role": "user", "content": [
      fmt_base.text_part(DIGIRL_SYSTEM + "\n" + "=====Your Turn=====" + "\nScreenshot: "),
      fmt_base.image_part(image),
      fmt_base.text_part(DIGIRL_YOUR_TURN.format(intent=intent))]}]


def parse_digirl_status(reply: str) -> Verdict:
  match = re.search(r"Status:\s*(\w+)", reply)
  if match is None:
    return Verdict(0.0, "judge reply has no 'Status:' (DigiRL counts this as failure)")
  status = match.group(1)
  return Verdict(1.0 if "success" in status.lower() else 0.0, f"judge: Status: {status}")


# ---------------------------------------------------------------------------------------- the judge


def _image_array(image: Any, image_root: str) -> np.ndarray:
  from PIL import Image  # pylint: disable=g-import-not-at-top

  if isinstance(image, np.ndarray):
    return image
  path = image if not image_root or os.path.isabs(image) else os.path.join(image_root, image)
  with Image.open(path) as im:
    return np.asarray(im.convert("RGB"))


def _quarter(image: np.ndarray) -> bytes:
  """DigiRL's `process_image`: resize to 1/4 width and height, as PNG."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  im = Image.fromarray(image)
  im = im.resize((max(1, im.width // 4), max(1, im.height // 4)))
  buf = io.BytesIO()
  im.save(buf, format="PNG")
  return buf.getvalue()


def _final_answer(trajectory: Trajectory) -> str | None:
  """The answer of an episode that ended with ANSWER, else None (WebVoyager then scores 0)."""
  last = trajectory.steps[-1] if trajectory.steps else None
  if last is not None and last.action is not None and last.action.kind == ActionKind.ANSWER:
    return last.action.text.strip()
  if trajectory.answer:
    return trajectory.answer.strip()
  return None


class LLMJudge:
  """A `Judge` that asks an OpenAI-compatible model; see the module docstring for the protocols."""

  def __init__(self, config: LLMJudgeConfig | dict | Any = None, client: Any = None):
    self.config = config if isinstance(config, LLMJudgeConfig) else LLMJudgeConfig.from_config(config or {})
    if self.config.protocol not in ("webvoyager", "digirl"):
      raise ValueError(f"LLM judge protocol {self.config.protocol!r} is unknown; use 'webvoyager' or 'digirl'")
    self.stats = JudgeStats()
    self._api = openai_client.OpenAIClient(openai_client.ClientConfig.like(self.config), client=client,
                                           stats=self.stats, owner="judge")

  def client(self):
    """The `openai.OpenAI` client, built (and its key looked up) on first use."""
    return self._api.client()

  def complete(self, messages: list[fmt_base.Message]) -> str:
    """The model's reply text; raises `JudgeUnavailable` (redacted reason) when none can be had."""
    try:
      return self._api.complete(messages)
    except openai_client.CompletionUnavailable as e:
      raise JudgeUnavailable(str(e)) from None

  # ---- protocols
  def evaluate(self, task: Task, trajectory: Trajectory) -> Verdict:
    try:
      if self.config.protocol == "webvoyager":
        verdict = self._webvoyager(task, trajectory)
      else:
        verdict = self._digirl(task, trajectory)
    except JudgeUnavailable as e:
      verdict = Verdict(None, f"unjudged: {e}")
    except (OSError, ValueError) as e:  # unreadable screenshots and the like: unjudged, with the reason
      verdict = Verdict(None, secrets.redact(f"unjudged: {type(e).__name__}: {e}"))
    key = "unjudged" if verdict.success is None else ("success" if verdict.success >= 1.0 else "failure")
    self._api.count("verdicts", key)
    return verdict

  def _root(self, trajectory: Trajectory) -> str:
    return trajectory.meta.get("image_root") or self.config.image_root

  def _webvoyager(self, task: Task, trajectory: Trajectory) -> Verdict:
    answer = _final_answer(trajectory)
    if answer is None:
      return Verdict(0.0, "no ANSWER at the end of the trajectory (WebVoyager's auto_eval scores 0 without asking)")
    k = self.config.max_attached_imgs
    root = self._root(trajectory)
    paths = [s.image_path for s in trajectory.steps if s.image_path][-k:]
    images = [p if os.path.isabs(p) or not root else os.path.join(root, p) for p in paths]
    reply = self.complete(webvoyager_messages(task.intent, answer, images, k))
    return parse_webvoyager_verdict(reply)

  def step_rewards(self, task: Task, trajectory: Trajectory) -> list[Verdict]:
    """DigiRL's per-step rewards: one verdict per step up to the first success (which ends the episode).

    A step the judge could not be asked about is `Verdict(None, reason)`; later steps are still judged.
    Raises ValueError naming the field when a step lacks its screenshots.
    """
    threshold = 0.001 * 255 ** 2
    seen: list[np.ndarray] = []
    root = self._root(trajectory)
    out: list[Verdict] = []
    for t, step in enumerate(trajectory.steps):
      if not step.image_path or not step.next_image_path:
        raise ValueError(f"step {t} lacks Step.image_path / Step.next_image_path (DigiRL judges each new screen)")
      prev = _image_array(step.image_path, root).astype(np.float64)
      cur_u8 = _image_array(step.next_image_path, root)
      cur = cur_u8.astype(np.float64)
      if prev.shape == cur.shape and np.mean((prev - cur) ** 2) < threshold:
        out.append(Verdict(0.0, f"step {t}: screen unchanged"))
        continue
      if any(s.shape == cur.shape and np.mean((s - cur) ** 2) < threshold for s in seen):
        out.append(Verdict(0.0, f"step {t}: screen seen before"))
        continue
      if len(seen) < 5:
        seen.append(cur)
      try:
        verdict = parse_digirl_status(self.complete(digirl_messages(task.intent, _quarter(cur_u8))))
      except JudgeUnavailable as e:
        verdict = Verdict(None, f"unjudged: {e}")
      out.append(Verdict(verdict.success, f"step {t}: {verdict.reason}"))
      if verdict.success == 1.0:
        break
    return out

  def _digirl(self, task: Task, trajectory: Trajectory) -> Verdict:
    steps = self.step_rewards(task, trajectory)
    reason = "; ".join(v.reason for v in steps) or "no steps"
    if any(v.success == 1.0 for v in steps):
      return Verdict(1.0, steps[-1].reason)
    if any(v.success is None for v in steps):
      return Verdict(None, reason)
    return Verdict(0.0, reason)

  def evaluate_many(self, pairs: Sequence[tuple[Task, Trajectory]]) -> list[Verdict]:
    """Judge many trajectories on a bounded thread pool; the order of the result follows `pairs`."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.config.concurrency)) as pool:
      return list(pool.map(lambda p: self.evaluate(*p), pairs))
