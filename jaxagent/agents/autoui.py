"""AutoUI / Android-in-the-Wild agent format (DigiRL, Digi-Q) and Digi-Q's action utilities.

Ported from DigiRL-agent/digirl:digirl/environment/android/autoui_utils.py and env.py
(`reference/algorithms.md` §4.2–4.3) and DigiRL-agent/digiq postprocessing (§5.1–5.2):
  * `autoui_prepare_prompt`: `"Previous Actions: " + to_autoui(last action) + " " + "Goal: {task}</s>"`,
    only the last action (`history[-1:]`); the first step is `"Previous Actions: Goal: {task}</s>"`;
  * `autoui_translate_action`: split on `"Action Decision: "`, then on `", "` into exactly 6 parts, points
    reversed from [y, x] to (x, y). The two splits sit OUTSIDE the original's try-block: a missing
    "Action Decision" or a `typed_text` containing ", " raises, and `AndroidEmulator.step` substitutes
    TaskImpossible, ending the episode. Here that is `invalid` with the original's messages unless
    `faithful_task_impossible=True`, which returns IMPOSSIBLE (reason kept) as the original env did.
    Errors inside the try-block and unknown action types gave the original `Idle` (a no-op); here they
    are `invalid` (also executed as a no-op) carrying the original's printed message;
  * `to_autoui`: the canonical decision string, points as [y, x] with 4 decimals, TaskImpossible written
    as STATUS_TASK_COMPLETE (the history the policy sees), Idle as "".
Coordinates are normalised to [0, 1] (`Action.normalized=True`); a DUAL_POINT whose touch and lift
points are equal is a CLICK, otherwise a SWIPE (the emulator taps below 10 px² of travel).
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any, Sequence

import numpy as np

from jaxagent.agents import base
from jaxagent.agents.images import IMAGE_TOKEN, SCREEN_SCALE, downscale
from jaxagent.types import Action, ActionKind, Observation, Step, Task

ACTION_TYPES = ("DUAL_POINT", "TYPE", "PRESS_BACK", "PRESS_HOME", "PRESS_ENTER", "STATUS_TASK_COMPLETE",
                "TASK_IMPOSSIBLE")
_NO_POINT = '"touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]"'
_KIND_TO_TYPE = {ActionKind.BACK: "PRESS_BACK", ActionKind.HOME: "PRESS_HOME",
                 ActionKind.ANSWER: "STATUS_TASK_COMPLETE", ActionKind.IMPOSSIBLE: "TASK_IMPOSSIBLE"}
_TYPE_TO_KIND = {"PRESS_BACK": ActionKind.BACK, "PRESS_HOME": ActionKind.HOME,
                 "STATUS_TASK_COMPLETE": ActionKind.ANSWER, "TASK_IMPOSSIBLE": ActionKind.IMPOSSIBLE}


def _is_enter(action: Action) -> bool:
  return action.kind == ActionKind.KEY and action.key.lower() == "enter"


def _decision(action_type: str, points: str = _NO_POINT, typed_text: str = "") -> str:
  return f'"action_type": "{action_type}", {points}, "typed_text": "{typed_text}"'


def _points(action: Action) -> str:
  x2 = action.x if action.kind == ActionKind.CLICK else action.x2
  y2 = action.y if action.kind == ActionKind.CLICK else action.y2
  return f'"touch_point": "[{action.y:.4f}, {action.x:.4f}]", "lift_point": "[{y2:.4f}, {x2:.4f}]"'


def _is_point_action(action: Action) -> bool:
  if action.kind == ActionKind.CLICK:
    return action.x is not None and action.y is not None
  return action.kind == ActionKind.SWIPE and None not in (action.x, action.y, action.x2, action.y2)


def decision(action: Action) -> str:
  """The decision string the AutoUI model emits for `action` (TASK_IMPOSSIBLE kept as itself)."""
  if _is_point_action(action):
    if not action.normalized:
      raise ValueError(f"AutoUI touch points are normalised to [0, 1]; got pixel coordinates {action.to_json()} "
                       "(divide by the screen size and set normalized=True)")
    return _decision("DUAL_POINT", _points(action))
  if action.kind == ActionKind.TYPE:
    return _decision("TYPE", typed_text=action.text)
  if _is_enter(action):
    return _decision("PRESS_ENTER")
  if action.kind in _KIND_TO_TYPE:
    return _decision(_KIND_TO_TYPE[action.kind])
  raise ValueError(f"AutoUI has no action for {action.to_json()}")


def to_autoui(action: Action | None) -> str:
  """The original `to_autoui` (history serialisation): TaskImpossible -> STATUS_TASK_COMPLETE, else "" if
  not expressible (the original prints "not supported yet" and returns "")."""
  if action is None:
    return ""
  if action.kind == ActionKind.IMPOSSIBLE:
    return _decision("STATUS_TASK_COMPLETE")
  expressible = (_is_point_action(action) or action.kind == ActionKind.TYPE or _is_enter(action)
                 or action.kind in _KIND_TO_TYPE)
  return decision(action) if expressible else ""


def autoui_prepare_prompt(task: str, history: Sequence[Action | None]) -> str:
  prompt = "Previous Actions: "
  for act in list(history)[-1:]:
    prompt += f"{to_autoui(act)} "
  return prompt + f"Goal: {task}</s>"


class TaskImpossibleError(Exception):
  """The original's out-of-try failure (split/unpack), which its env turns into TaskImpossible."""


def autoui_translate_action(out: str) -> Action:
  """Port of `autoui_translate_action`; raises `TaskImpossibleError` where the original raises."""
  try:
    action_str = out.split("Action Decision: ")[1]
    action_type, touch_1, touch_2, lift_1, lift_2, typed_text = action_str.split(", ")
  except (IndexError, ValueError) as e:
    raise TaskImpossibleError(f"{e}\nFailed to translate action: {out}, terminating the environment") from e
  touch_point = touch_1 + ", " + touch_2
  lift_point = lift_1 + ", " + lift_2
  try:
    action_type = action_type.split(": ")[1].strip('"')
    if action_type == "DUAL_POINT":
      touch_yx = [float(num) for num in touch_point.split(": ")[1].strip('[]"').split(", ")]
      lift_yx = [float(num) for num in lift_point.split(": ")[1].strip('[]"').split(", ")]
      touch, lift = touch_yx[::-1], lift_yx[::-1]
      if len(touch) != 2 or len(lift) != 2:  # the original's env asserts this before executing
        raise AssertionError(f"touch_point and lift_point need 2 coordinates, got {touch_yx} and {lift_yx}")
      if touch == lift:
        return Action(ActionKind.CLICK, x=touch[0], y=touch[1], normalized=True)
      return Action(ActionKind.SWIPE, x=touch[0], y=touch[1], x2=lift[0], y2=lift[1], normalized=True)
    if action_type == "TYPE":
      return Action(ActionKind.TYPE, text=typed_text.split(": ")[1].strip('"'))
    if action_type == "PRESS_ENTER":
      return Action(ActionKind.KEY, key="Enter")
    if action_type in _TYPE_TO_KIND:
      return Action(_TYPE_TO_KIND[action_type])
    return Action.invalid(f"Action {out} not supported yet.")
  except Exception as e:  # pylint: disable=broad-except  # the original's try-block -> Idle
    return Action.invalid(f"Action {out} Parsing Error: {e}")


def prompt_turns(prompt: str) -> list[dict[str, str]]:
  """The one human turn a VLM reads the AutoUI prompt in: the screen's image, then the prompt (an AutoUI
  encoder-decoder reads the same turn without the marker, `data.seq2seq`)."""
  return [base.human_turn(f"{IMAGE_TOKEN}\n{prompt}")]


@base.register("autoui")
class AutoUI(base.AgentFormat):
  """AutoUI-Base's text side (the image goes in as BLIP-2 features, outside the prompt)."""

  name = "autoui"
  supported_kinds = frozenset({ActionKind.CLICK, ActionKind.SWIPE, ActionKind.TYPE, ActionKind.KEY, ActionKind.BACK,
                               ActionKind.HOME, ActionKind.ANSWER, ActionKind.IMPOSSIBLE})

  parse_rules = ("lenient", "faithful")  # faithful: a decision the original's split cannot unpack ends the episode
  _parse_options = ("faithful_task_impossible",)

  def __init__(self, faithful_task_impossible: bool = False, screen_scale: float = SCREEN_SCALE):
    """`screen_scale`: the screenshot's size relative to the screen's in the prompt (the seeds' 1/4-resolution
    `smaller_images/`)."""
    self.faithful_task_impossible = faithful_task_impossible
    self.screen_scale = float(screen_scale)

  @property
  def parse_rule(self) -> str:
    return "faithful" if self.faithful_task_impossible else "lenient"

  def set_parse_rule(self, rule: str) -> None:
    super().set_parse_rule(rule)
    self.faithful_task_impossible = rule == "faithful"

  def turns(self, observation: Observation, history: Sequence[Step]) -> tuple[list[dict[str, str]], list]:
    """One human turn, the screen's image then the AutoUI prompt, over the scaled screenshot."""
    prompt = self.build_prompt(observation.intent, observation, history)
    return prompt_turns(prompt), [downscale(observation.screenshot, self.screen_scale)]

  def build_prompt(self, task: Task | str, observation: Observation, history: Sequence[Step]) -> str:
    return autoui_prepare_prompt(base.task_intent(task), [s.action for s in history])

  def observation_text(self, task, observation, history) -> str:
    return self.build_prompt(task, observation, history)

  def _parse(self, text: str) -> Action:
    try:
      return autoui_translate_action(text)
    except TaskImpossibleError as e:
      if self.faithful_task_impossible:
        return Action(ActionKind.IMPOSSIBLE, reason=str(e))
      return Action.invalid(str(e))

  def render(self, action: Action, thought: str = "") -> str:
    """`Action Plan: [...] ; Action Decision: ...`; `thought` (if given) is the plan's item list."""
    if action.kind not in self.supported_kinds:
      raise self._unsupported(action)
    d = decision(action)
    plan = thought or re.search(r'"action_type": "(\w+)"', d).group(1)
    return f"Action Plan: [{plan}] ; Action Decision: {d}"


# ------------------------------------------------------------------------------ Digi-Q utilities


def digiq_parse_action(raw_action: str) -> dict[str, str | None]:
  """Digi-Q's `parse_action`: each field's quoted value by regex (None when absent)."""
  out = {}
  for key in ("action_type", "touch_point", "lift_point", "typed_text"):
    match = re.search(f'"{key}": "(.*?)"', raw_action)
    out[key] = match.group(1) if match else None
  return out


_NUMBER = r"-?\d+(?:\.\d+)?"
_POINT = rf'"\[({_NUMBER}), ({_NUMBER})\]"'
_WELL_FORMED = re.compile(rf'Action Plan: \[[A-Z_, ]*\] ; Action Decision: "action_type": "({"|".join(ACTION_TYPES)})", '
                          rf'"touch_point": {_POINT}, "lift_point": {_POINT}, "typed_text": "(.*)"', re.DOTALL)


def is_action_valid(raw_action: str, max_plan_items: int = 8) -> bool:
  """Digi-Q's candidate filter (§5.1 step 4; reconstructed from the reference's description, the script
  itself is not public here): an Action Plan with <= 8 items all in the AutoUI action set, a typed_text
  field, and touch/lift points that `ast.literal_eval` reads. Stricter than the description in one way: the
  whole string must be a well-formed AutoUI decision (known action type, two numbers in [-1, 1] per point),
  because a tiny actor sampled at temperature 1.2 emits strings like `"lift_point": "[0.7950]", 0.1650]"`
  whose fields still parse, and Best-of-N would otherwise teach them back to the actor."""
  try:
    plan = re.search(r"Action Plan: \[(.*?)\]", raw_action)
    if plan is None:
      return False
    items = [i.strip() for i in plan.group(1).split(",") if i.strip()]
    if not items or len(items) > max_plan_items or any(i not in ACTION_TYPES for i in items):
      return False
    parsed = digiq_parse_action(raw_action)
    if not isinstance(parsed["typed_text"], str):
      return False
    with warnings.catch_warnings():  # sampled garbage like "[0.1.2]" would print a SyntaxWarning per call
      warnings.simplefilter("ignore", SyntaxWarning)
      warnings.simplefilter("ignore", DeprecationWarning)  # an invalid escape's category before Python 3.12
      ast.literal_eval(parsed["touch_point"])
      ast.literal_eval(parsed["lift_point"])
    form = _WELL_FORMED.fullmatch(raw_action.strip())
    return form is not None and all(-1.0 <= float(v) <= 1.0 for v in form.groups()[1:5])
  except Exception:  # pylint: disable=broad-except
    return False


ACTIONABLE_COMMAND = "Respond only 'Yes' or 'No' (without period / quotation marks) and don't respond anything else."


def actionable_prompt(parsed_action: dict[str, Any] | None) -> str:
  """The representation fine-tuning prompt (§5.2, `construct_sft_data.py:make_prompt`, verbatim). Fields are
  formatted as given: Digi-Q passes the parsed action, whose `touch_point` is the `ast.literal_eval`'d list
  (`proj.digiq.screens.parse_action`), so the prompt shows Python's str of it, e.g. "[0.165, 0.5]"."""
  head = "<image>\nYou're given a user interface. "
  kind = parsed_action.get("action_type") if parsed_action is not None else None
  if kind == "DUAL_POINT":
    body = (f"There is a cursor in the screen. The touch point is located at {parsed_action['touch_point']} "
            "Is this cursor Clicking on any interactive elements?")
  elif kind == "TYPE":
    body = (f"If a user now Types {parsed_action['typed_text']}, will this Type action effectively input the text "
            "into somewhere on the Screenshot?")
  elif kind == "PRESS_HOME":
    body = "If a user now Presses the <HOME> button, will this action effectively navigate the user to the Home screen?"
  elif kind == "PRESS_BACK":
    body = ("If a user now Presses the <BACK> button, will this action effectively navigate the user to the previous "
            "screen?")
  elif kind == "PRESS_ENTER":
    body = "If a user now Presses the <ENTER> button, will this action effectively submit the form?"
  else:
    body = "Is this action effective?"
  return head + body + "\n" + ACTIONABLE_COMMAND


def actionable_label(small_image: np.ndarray, small_next_image: np.ndarray, threshold: float = 30.0) -> str:
  """"Yes" iff the action changed the (downscaled) screen: pixel MSE > 30 (`construct_sft_data.py:judge`)."""
  diff = np.mean((np.asarray(small_image, np.float64) - np.asarray(small_next_image, np.float64)) ** 2)
  return "Yes" if diff > threshold else "No"
