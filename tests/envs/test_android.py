"""AdbDevice command construction. A real emulator cannot run here, so only the adb argv is checked
(no mock device: the commands are compared with what DigiRL's executor does, `reference/algorithms.md` §4.3)."""

import pytest

from jaxagent.envs.android import AdbDevice
from jaxagent.types import Action, ActionKind

DEV = AdbDevice(serial="emulator-5554", width=1080, height=2400)
SHELL = ["adb", "-s", "emulator-5554", "shell", "input"]


def test_normalised_dual_point_close_together_is_a_tap():
  a = Action(ActionKind.SWIPE, x=0.5, y=0.25, x2=0.501, y2=0.2505, normalized=True)
  assert DEV.commands(a) == [SHELL + ["tap", "540", "600"]]


def test_normalised_dual_point_far_apart_is_a_swipe():
  a = Action(ActionKind.SWIPE, x=0.5, y=0.8, x2=0.5, y2=0.2, normalized=True)
  assert DEV.commands(a) == [SHELL + ["swipe", "540", "1920", "540", "480", "300"]]


def test_click_in_pixels_and_default_device():
  assert AdbDevice().commands(Action(ActionKind.CLICK, x=10, y=20)) == [["adb", "shell", "input", "tap", "10", "20"]]


def test_keys_back_home_enter():
  assert DEV.commands(Action(ActionKind.BACK)) == [SHELL + ["keyevent", "4"]]
  assert DEV.commands(Action(ActionKind.HOME)) == [SHELL + ["keyevent", "3"]]
  assert DEV.commands(Action(ActionKind.KEY, key="Enter")) == [SHELL + ["keyevent", "66"]]


def test_type_escapes_spaces_and_shell_characters_then_enter():
  cmds = DEV.commands(Action(ActionKind.TYPE, text="it's $5 & up", enter=True))
  assert cmds == [SHELL + ["text", "it\\'s%s\\$5%s\\&%sup"], SHELL + ["keyevent", "66"]]


def test_episode_enders_and_noops_send_nothing():
  for kind in (ActionKind.ANSWER, ActionKind.IMPOSSIBLE, ActionKind.NOOP, ActionKind.INVALID):
    assert DEV.commands(Action(kind)) == []


def test_unsupported_actions_name_the_problem():
  with pytest.raises(ValueError, match="not in the AitW device action space"):
    DEV.commands(Action(ActionKind.SELECT, element=1, text="x"))
  with pytest.raises(ValueError, match="needs x and y"):
    DEV.commands(Action(ActionKind.CLICK, element=3))


def test_screenshot_command():
  assert DEV.screenshot_command() == ["adb", "-s", "emulator-5554", "exec-out", "screencap", "-p"]
