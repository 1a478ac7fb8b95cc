"""WebVoyager's GPT-4o agent format (set-of-marks, text-only, and OpenWebVoyager's a11y+screenshot teacher).

Ported from MinorJerry/WebVoyager:run.py,utils.py and MinorJerry/OpenWebVoyager:WebVoyager/run.py,utils.py
(`reference/algorithms.md` §1.3–1.4):
  * `extract_information` with exactly the originals' regexes, tried in order;
  * the reply is split on `Thought:|Action:|Observation:` and the action is the 3rd segment; a reply
    without both "Thought:" and "Action:" is the Format ERROR;
  * an action no regex matches made the original raise inside its executor's try-block, which turned it
    into the execution-failure feedback: that text is the `invalid` reason here;
  * user turns (`format_msg`, `format_msg_text_only`, `format_msg_acctree_and_screenshot`) and history
    clipping (`clip_message_and_obs[_text_only]`, last `max_attached_imgs` = 3 images by default).

Feedback from the previous step arrives in `Observation.error`: the env puts the failed action's
`reason` (Format ERROR or execution failure) or a type warning / PDF answer there. WebVoyager's own
loop then sends the failure text alone, without a new screenshot; OpenWebVoyager's teacher sends it
with the observation. Both behaviours are reproduced.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

from jaxagent.agents import base
from jaxagent.agents import webvoyager_prompts as P
from jaxagent.types import Action, ActionKind, Observation, Step, Task

REPLY_SPLIT = r"Thought:|Action:|Observation:"

_PATTERNS_COMMON = {
    "click": r"Click \[?(\d+)\]?",
    "type": r"Type \[?(\d+)\]?[; ]+\[?(.[^\]]*)\]?",
    "scroll": r"Scroll \[?(\d+|WINDOW)\]?[; ]+\[?(up|down)\]?",
    "wait": r"^Wait",
    "goback": r"^GoBack",
}
# WebVoyager (utils.py): Google, `ANSWER[; ]+`.
PATTERNS_WEBVOYAGER = {**_PATTERNS_COMMON, "google": r"^Google", "answer": r"ANSWER[; ]+\[?(.[^\]]*)\]?"}
# OpenWebVoyager (WebVoyager/utils.py:225): Restart, `ANSWER[;: ]+`.
PATTERNS_OPENWEBVOYAGER = {**_PATTERNS_COMMON, "restart": r"^Restart", "answer": r"ANSWER[;: ]+\[?(.[^\]]*)\]?"}

_NO_CONTENT = ("click", "wait", "goback", "google", "restart")


def extract_information(text: str, patterns: dict[str, str] = PATTERNS_WEBVOYAGER) -> tuple[Any, Any]:
  """The original `extract_information`: (key, info) of the first matching pattern, or (None, None)."""
  for key, pattern in patterns.items():
    match = re.search(pattern, text)
    if match:
      if key in _NO_CONTENT:
        return key, match.groups()
      if key in ("type", "scroll"):
        return key, {"number": match.group(1), "content": match.group(2)}
      return key, {"content": match.group(1)}
  return None, None


def info_to_action(key: str | None, info: Any, fail_text: str) -> Action:
  if key is None:
    return Action.invalid(fail_text)
  if key == "click":
    return Action(ActionKind.CLICK, element=int(info[0]))
  if key == "type":
    return Action(ActionKind.TYPE, element=int(info["number"]), text=info["content"], enter=True)
  if key == "scroll":
    number = info["number"]
    return Action(ActionKind.SCROLL, element=None if number == "WINDOW" else int(number), direction=info["content"])
  if key == "wait":
    return Action(ActionKind.WAIT)
  if key == "goback":
    return Action(ActionKind.BACK)
  if key in ("google", "restart"):
    return Action(ActionKind.RESTART)
  return Action(ActionKind.ANSWER, text=info["content"])


def parse_reply(text: str, patterns: dict[str, str], fail_text: str) -> Action:
  """The originals' reply handling: Thought/Action check, split, `extract_information`."""
  if "Thought:" not in text or "Action:" not in text:
    return Action.invalid(P.FORMAT_ERROR)
  chosen_action = re.split(REPLY_SPLIT, text)[2].strip()
  return info_to_action(*extract_information(chosen_action, patterns), fail_text)


def render_action(action: Action, jump: str = "Google") -> str:
  """The action line as the prompt's format section writes it (e.g. `Type [6]; KNTPLC`)."""
  k = action.kind
  if k == ActionKind.CLICK and action.element is not None:
    return f"Click [{action.element}]"
  if k == ActionKind.TYPE and action.element is not None:
    return f"Type [{action.element}]; {action.text}"
  if k == ActionKind.SCROLL and action.direction in ("up", "down"):
    target = "WINDOW" if action.element is None else action.element
    return f"Scroll [{target}]; {action.direction}"
  if k == ActionKind.WAIT:
    return "Wait"
  if k == ActionKind.BACK:
    return "GoBack"
  if k == ActionKind.RESTART:
    return jump
  if k == ActionKind.ANSWER:
    return f"ANSWER; {action.text}"
  raise ValueError(f"WebVoyager has no action for {action.to_json()}")


def render_reply(action: Action, thought: str = "", jump: str = "Google") -> str:
  """A full reply in the format GPT-4o was asked for (`Thought: ...\\n\\nAction: ...`)."""
  return f"Thought: {thought}\n\nAction: {render_action(action, jump)}"


def is_failure_feedback(error: str) -> bool:
  """Feedback after which the originals re-ask for Thought and Action (not a warning or PDF answer)."""
  return error.startswith("The action you have chosen cannot be exe") or error.startswith("Format ERROR")


# --------------------------------------------------------------------------------- history clipping


def clip_message_and_obs(msg: list[base.Message], max_img_num: int) -> list[base.Message]:
  """`utils.py:clip_message_and_obs`: only the last `max_img_num` image-carrying user turns keep images."""
  clipped: list[base.Message] = []
  img_num = 0
  for curr in reversed(msg):
    if curr["role"] != "user" or isinstance(curr["content"], str):
      clipped.insert(0, curr)
    elif img_num < max_img_num:
      img_num += 1
      clipped.insert(0, curr)
    else:
      text = curr["content"][0]["text"]
      head = text.split("Observation:")[0].strip()
      tail = P.CLIPPED_OBS_PDF if "You downloaded a PDF file" in text else P.CLIPPED_OBS
      clipped.insert(0, {"role": curr["role"], "content": head + tail})
  return clipped


def clip_message_and_obs_text_only(msg: list[base.Message], max_tree_num: int) -> list[base.Message]:
  """`utils.py:clip_message_and_obs_text_only`: the last `max_tree_num` user turns keep their tree."""
  clipped: list[base.Message] = []
  tree_num = 0
  for curr in reversed(msg):
    if curr["role"] != "user":
      clipped.insert(0, curr)
    elif tree_num < max_tree_num:
      tree_num += 1
      clipped.insert(0, curr)
    else:
      text = curr["content"]
      head = text.split("Observation:")[0].strip()
      tail = P.CLIPPED_TREE_PDF if "You downloaded a PDF file" in text else P.CLIPPED_TREE
      clipped.insert(0, {"role": curr["role"], "content": head + tail})
  return clipped


# ---------------------------------------------------------------------------------------- formats


@dataclasses.dataclass(frozen=True)
class _Variant:
  system_prompt: str
  obs_prompt: str
  patterns: dict[str, str]
  fail_text: str  # what an unparsable action turns into
  jump: str  # "Google" | "Restart"
  images: bool
  fail_replaces_turn: bool  # WebVoyager: failure feedback is the whole next user turn


class _WebVoyagerBase(base.AgentFormat):
  """Shared machinery; the variants differ only in the `_Variant` strings and the user-turn layout."""

  variant: _Variant

  def __init__(self, max_attached_imgs: int = 3):
    if max_attached_imgs < 1:
      raise ValueError(f"max_attached_imgs must be >= 1 (the originals use 3), got {max_attached_imgs}")
    self.max_attached_imgs = max_attached_imgs

  supported_kinds = frozenset({ActionKind.CLICK, ActionKind.TYPE, ActionKind.SCROLL, ActionKind.WAIT,
                               ActionKind.BACK, ActionKind.RESTART, ActionKind.ANSWER})

  # ---- user turns
  def _first_turn(self, ques: str, web: str, obs: Observation) -> str:
    raise NotImplementedError

  def _later_turn(self, warn_obs: str, pdf_obs: str, obs: Observation) -> str:
    raise NotImplementedError

  def observation_text(self, task: Task | str, observation: Observation, history: Sequence[Step]) -> str:
    error = observation.error
    if not history:
      web = task.start_url if isinstance(task, Task) else observation.url
      return self._first_turn(base.task_intent(task), web, observation)
    if error and is_failure_feedback(error) and self.variant.fail_replaces_turn:
      return error
    if error.startswith(P.PDF_OBS_PREFIX):
      return self._later_turn("", error, observation)
    return self._later_turn(error, "", observation)

  def _turn_message(self, text: str, image: Any) -> base.Message:
    if not self.variant.images:
      return {"role": "user", "content": text}
    if self.variant.fail_replaces_turn and is_failure_feedback(text):
      return {"role": "user", "content": text}
    if image is None:
      return {"role": "user", "content": [base.text_part(text)]}
    return {"role": "user", "content": [base.text_part(text), base.image_part(image)]}

  def build_prompt(self, task: Task | str, observation: Observation, history: Sequence[Step]) -> list[base.Message]:
    messages: list[base.Message] = [{"role": "system", "content": self.variant.system_prompt}]
    for i, step in enumerate(history):
      if not step.obs_text:
        raise ValueError(f"history[{i}].obs_text is empty: record `{self.name}.observation_text(...)` in "
                         "Step.obs_text for every step")
      messages.append(self._turn_message(step.obs_text, step.image_path))
      messages.append({"role": "assistant", "content": step.action_text})
    text = self.observation_text(task, observation, history)
    messages.append(self._turn_message(text, observation.screenshot))
    if not self.variant.images:
      return clip_message_and_obs_text_only(messages, self.max_attached_imgs)
    return clip_message_and_obs(messages, self.max_attached_imgs)

  # ---- actions
  def _parse(self, text: str) -> Action:
    return parse_reply(text, self.variant.patterns, self.variant.fail_text)

  def render(self, action: Action, thought: str = "") -> str:
    if action.kind not in self.supported_kinds:
      raise self._unsupported(action)
    return render_reply(action, thought, self.variant.jump)


@base.register("webvoyager")
class WebVoyagerSoM(_WebVoyagerBase):
  """GPT-4V/4o with set-of-marks screenshots and the textual element list (`run.py:format_msg`)."""

  name = "webvoyager"
  variant = _Variant(P.SYSTEM_PROMPT, P.OBS_PROMPT_SOM, PATTERNS_WEBVOYAGER, P.FAIL_OBS_WEBVOYAGER, "Google",
                     images=True, fail_replaces_turn=True)

  def _first_turn(self, ques, web, obs):
    init = P.INIT_MSG.format(ques=ques, web=web) + self.variant.obs_prompt
    return init + P.SOM_ELEMENT_NOTE + obs.element_text

  def _later_turn(self, warn_obs, pdf_obs, obs):
    if pdf_obs:
      return (f"Observation: {pdf_obs} {P.PDF_FOLLOWUP} The screenshot of the current page is also attached, give "
              f"the Thought and Action. {P.SOM_ELEMENT_NOTE}{obs.element_text}")
    return (f"Observation:{warn_obs} please analyze the attached screenshot and give the Thought and Action. "
            f"{P.SOM_ELEMENT_NOTE}{obs.element_text}")


@base.register("webvoyager_text")
class WebVoyagerTextOnly(_WebVoyagerBase):
  """Text-only WebVoyager over the accessibility tree (`run.py:format_msg_text_only`)."""

  name = "webvoyager_text"
  variant = _Variant(P.SYSTEM_PROMPT_TEXT_ONLY, P.OBS_PROMPT_TEXT, PATTERNS_WEBVOYAGER, P.FAIL_OBS_WEBVOYAGER,
                     "Google", images=False, fail_replaces_turn=True)

  def _first_turn(self, ques, web, obs):
    return P.INIT_MSG.format(ques=ques, web=web) + self.variant.obs_prompt + "\n" + obs.a11y_tree

  def _later_turn(self, warn_obs, pdf_obs, obs):
    if pdf_obs:
      return (f"Observation: {pdf_obs} {P.PDF_FOLLOWUP} The accessibility tree of the current page is also given, "
              f"give the Thought and Action.\n{obs.a11y_tree}")
    return (f"Observation:{warn_obs} please analyze the accessibility tree and give the Thought and Action.\n"
            f"{obs.a11y_tree}")


@base.register("webvoyager_actree_image")
class WebVoyagerActreeImage(_WebVoyagerBase):
  """OpenWebVoyager's GPT-4o teacher: a11y tree + plain screenshot (`format_msg_acctree_and_screenshot`).

  This is the format that collected OpenWebVoyager's imitation data (`run_webvoyager_4o.sh`).
  """

  name = "webvoyager_actree_image"
  variant = _Variant(P.SYSTEM_PROMPT_ACTREE_IMAGE, P.OBS_PROMPT_ACTREE_IMAGE, PATTERNS_OPENWEBVOYAGER,
                     P.FAIL_OBS_OPENWEBVOYAGER, "Restart", images=True, fail_replaces_turn=False)

  def _first_turn(self, ques, web, obs):
    init = P.INIT_MSG.format(ques=ques, web=web) + self.variant.obs_prompt
    return init + f"I've provided the Accessibility Tree and Screenshot.\n{obs.a11y_tree}\nScreenshot:\n"

  def _later_turn(self, warn_obs, pdf_obs, obs):
    if pdf_obs:
      return (f"Observation: {pdf_obs} {P.PDF_FOLLOWUP} The accessibility tree & screenshot of the current page is "
              f"also attached, give the Thought and Action.\n{obs.a11y_tree}\nScreenshot:\n")
    return (f"Observation:{warn_obs} please analyze the attached Accessibility Tree & screenshot and give the Thought "
            f"and Action.\n{obs.a11y_tree}\nScreenshot:\n")

