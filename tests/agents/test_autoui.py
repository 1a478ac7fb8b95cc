"""AutoUI / AitW format (DigiRL, Digi-Q): prompt, translate_action, to_autoui, Digi-Q utilities."""

import warnings

import numpy as np
import pytest

from jaxagent.agents import autoui
from jaxagent.agents import get_format
from jaxagent.types import Action, ActionKind, Observation, Step

EXAMPLE = ('Action Plan: [DUAL_POINT,TYPE,PRESS_ENTER] ; Action Decision: "action_type": "DUAL_POINT", '
           '"touch_point": "[0.7761, 0.7089]", "lift_point": "[0.7761, 0.7089]", "typed_text": ""')
GOAL = "Search for hotels in Washington DC"


def test_translate_reference_example():
  a = get_format("autoui").parse(EXAMPLE)
  assert a == Action(ActionKind.CLICK, x=0.7089, y=0.7761, normalized=True)  # [y, x] reversed to (x, y)


@pytest.mark.parametrize("decision,expected", [
    ('"action_type": "DUAL_POINT", "touch_point": "[0.8000, 0.5000]", "lift_point": "[0.2000, 0.5000]", "typed_text": ""',
     Action(ActionKind.SWIPE, x=0.5, y=0.8, x2=0.5, y2=0.2, normalized=True)),
    ('"action_type": "TYPE", "touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": "hotels in dc"',
     Action(ActionKind.TYPE, text="hotels in dc")),
    ('"action_type": "PRESS_BACK", "touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": ""',
     Action(ActionKind.BACK)),
    ('"action_type": "PRESS_HOME", "touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": ""',
     Action(ActionKind.HOME)),
    ('"action_type": "PRESS_ENTER", "touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": ""',
     Action(ActionKind.KEY, key="Enter")),
    ('"action_type": "STATUS_TASK_COMPLETE", "touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": ""',
     Action(ActionKind.ANSWER)),
    ('"action_type": "TASK_IMPOSSIBLE", "touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": ""',
     Action(ActionKind.IMPOSSIBLE)),
])
def test_translate_every_action_type(decision, expected):
  fmt = get_format("autoui")
  assert fmt.parse("Action Plan: [X] ; Action Decision: " + decision) == expected
  if expected.kind != ActionKind.ANSWER or not expected.text:
    assert fmt.render(expected).endswith("Action Decision: " + decision)


def test_out_of_try_errors_are_invalid_or_task_impossible():
  fmt = get_format("autoui")
  no_decision = fmt.parse("Action Plan: [TYPE]")
  assert no_decision == Action.invalid(
      "list index out of range\nFailed to translate action: Action Plan: [TYPE], terminating the environment")
  comma = ('Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", '
           '"typed_text": "paris, france"')
  assert fmt.parse(comma).reason.startswith("too many values to unpack (expected 6")
  faithful = get_format("autoui", faithful_task_impossible=True)
  impossible = faithful.parse(comma)
  assert impossible.kind == ActionKind.IMPOSSIBLE and impossible.ends_episode
  assert "Failed to translate action" in impossible.reason


def test_in_try_errors_are_the_originals_idle_messages():
  fmt = get_format("autoui")
  bad_float = ('Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.1, abc]", '
               '"lift_point": "[0.1, 0.2]", "typed_text": ""')
  assert fmt.parse(bad_float).reason == f"Action {bad_float} Parsing Error: could not convert string to float: 'abc'"
  unknown = 'Action Decision: "action_type": "LONG_PRESS", "a": "[1", "b": "2]", "c": "[3", "d": "4]", "e": ""'
  assert fmt.parse(unknown) == Action.invalid(f"Action {unknown} not supported yet.")


def test_prepare_prompt_and_to_autoui():
  fmt = get_format("autoui")
  assert fmt.build_prompt(GOAL, Observation(), []) == f"Previous Actions: Goal: {GOAL}</s>"
  hist = [Step(step=0, action=Action(ActionKind.BACK)),
          Step(step=1, action=Action(ActionKind.CLICK, x=0.70894, y=0.77606, normalized=True))]
  assert fmt.build_prompt(GOAL, Observation(), hist) == (
      'Previous Actions: "action_type": "DUAL_POINT", "touch_point": "[0.7761, 0.7089]", "lift_point": '
      f'"[0.7761, 0.7089]", "typed_text": "" Goal: {GOAL}</s>')
  # TaskImpossible is written as STATUS_TASK_COMPLETE in the history; Idle/invalid as "".
  assert autoui.to_autoui(Action(ActionKind.IMPOSSIBLE)).startswith('"action_type": "STATUS_TASK_COMPLETE"')
  assert autoui.autoui_prepare_prompt(GOAL, [Action.invalid("x")]) == f"Previous Actions:  Goal: {GOAL}</s>"


def test_render_and_digiq_validity():
  fmt = get_format("autoui")
  s = fmt.render(Action(ActionKind.TYPE, text="airpods"))
  assert s == ('Action Plan: [TYPE] ; Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, -1.0]", '
               '"lift_point": "[-1.0, -1.0]", "typed_text": "airpods"')
  assert autoui.is_action_valid(s) and autoui.is_action_valid(EXAMPLE)
  assert not autoui.is_action_valid(s.replace("Action Plan: [TYPE] ; ", ""))  # no plan
  assert not autoui.is_action_valid(s.replace("[TYPE]", "[" + ",".join(["TYPE"] * 9) + "]"))  # > 8 items
  assert not autoui.is_action_valid(s.replace("[TYPE]", "[SCROLL]"))  # not an AutoUI action
  assert not autoui.is_action_valid(s.replace('"[-1.0, -1.0]"', '"[-1.0, oops]"'))  # points not literals
  # Fields that parse inside a malformed decision (as a tiny actor samples them at temperature 1.2).
  tap = EXAMPLE.replace("[DUAL_POINT,TYPE,PRESS_ENTER]", "[DUAL_POINT]")
  assert autoui.is_action_valid(tap)
  assert not autoui.is_action_valid(tap.replace('"[0.7761, 0.7089]", "typed_text"', '"[0.7089]", 0.7089]"typed_text"'))
  assert not autoui.is_action_valid(tap.replace('"action_type": "DUAL_POINT"', '"action_type": "DUAL_Phosen]"'))
  assert not autoui.is_action_valid(tap.replace("Action Decision", "Action Deision"))
  assert not autoui.is_action_valid(tap.replace("[0.7761, 0.7089]", "[3.5, 0.7089]"))  # off the screen
  with pytest.raises(ValueError, match="cannot render action kind 'noop'"):
    fmt.render(Action(ActionKind.NOOP))
  with pytest.raises(ValueError, match="normalised to"):
    fmt.render(Action(ActionKind.CLICK, x=300, y=500))


def test_actionable_prompts_and_label():
  tap = autoui.digiq_parse_action(EXAMPLE)
  assert tap == {"action_type": "DUAL_POINT", "touch_point": "[0.7761, 0.7089]", "lift_point": "[0.7761, 0.7089]",
                 "typed_text": ""}
  suffix = "\nRespond only 'Yes' or 'No' (without period / quotation marks) and don't respond anything else."
  assert autoui.actionable_prompt(tap) == (
      "<image>\nYou're given a user interface. There is a cursor in the screen. The touch point is located at "
      "[0.7761, 0.7089] Is this cursor Clicking on any interactive elements?" + suffix)
  assert autoui.actionable_prompt({"action_type": "TYPE", "typed_text": "hi"}) == (
      "<image>\nYou're given a user interface. If a user now Types hi, will this Type action effectively input the "
      "text into somewhere on the Screenshot?" + suffix)
  assert autoui.actionable_prompt({"action_type": "PRESS_HOME"}).startswith(
      "<image>\nYou're given a user interface. If a user now Presses the <HOME> button, will this action effectively "
      "navigate the user to the Home screen?")
  assert "navigate the user to the previous screen?" in autoui.actionable_prompt({"action_type": "PRESS_BACK"})
  assert "effectively submit the form?" in autoui.actionable_prompt({"action_type": "PRESS_ENTER"})
  assert autoui.actionable_prompt(None) == "<image>\nYou're given a user interface. Is this action effective?" + suffix
  a = np.zeros((4, 4, 3), np.uint8)
  assert autoui.actionable_label(a, a + 5) == "No" and autoui.actionable_label(a, a + 6) == "Yes"  # MSE 25 vs 36


def test_digiq_validity_of_a_point_with_an_invalid_escape_is_false_without_a_warning():
  text = ('Action Plan: [TYPE] ; Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, \'\\d\']", '
          '"lift_point": "[-1.0, -1.0]", "typed_text": "x"')
  with warnings.catch_warnings(record=True) as shown:
    warnings.simplefilter("always")
    assert autoui.is_action_valid(text) is False
  assert not shown
