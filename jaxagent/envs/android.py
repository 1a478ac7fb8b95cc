"""The AitW device action space over ADB, for users with an Android emulator or phone.

It CANNOT run here (no emulator, no KVM): this machine tests only the command construction
(`tests/envs/test_android.py`). It mirrors DigiRL's execution (`reference/algorithms.md` §4.3): a normalised
[0, 1] point pair becomes `input tap` when the two points are closer than sqrt(10) px, else `input swipe`;
back / home / enter are key events 4 / 3 / 66; typed text goes through `input text`. Screenshots come from
`exec-out screencap -p`. DigiRL drove Appium; plain `adb` needs nothing but platform-tools.
"""

from __future__ import annotations

import dataclasses
import io
import subprocess

import numpy as np

from jaxagent.types import Action, ActionKind

KEYCODE_HOME = 3
KEYCODE_BACK = 4
KEYCODE_ENTER = 66
_TAP_MAX_SQ_DIST = 10  # DigiRL: (dx² + dy²) < 10 px² is a tap


def _escape_text(text: str) -> str:
  """`adb shell input text` takes one shell word: spaces become %s and shell metacharacters are escaped."""
  out = []
  for ch in text:
    if ch == " ":
      out.append("%s")
    elif ch in "\\\"'`$&|;<>()*?~!#[]{}%":
      out.append("\\" + ch)
    else:
      out.append(ch)
  return "".join(out)


@dataclasses.dataclass
class AdbDevice:
  """Builds (and, with `run`, executes) the adb commands for one device.

  Args:
    serial: the device's serial (`adb devices`), e.g. "emulator-5554"; None = the only device.
    width, height: the screen size in pixels that normalised points scale to (`adb shell wm size`).
    adb: the adb binary.
    swipe_ms: duration of a swipe.
  """

  serial: str | None = None
  width: int = 1080
  height: int = 2400
  adb: str = "adb"
  swipe_ms: int = 300

  def _base(self) -> list[str]:
    return [self.adb] + (["-s", self.serial] if self.serial else [])

  def _to_px(self, x: float, y: float, normalized: bool) -> tuple[int, int]:
    if normalized:
      return round(x * self.width), round(y * self.height)
    return round(x), round(y)

  def commands(self, action: Action) -> list[list[str]]:
    """The adb invocations that carry out `action` (empty for no-ops and episode-ending actions)."""
    shell = self._base() + ["shell", "input"]
    kind = action.kind
    if kind in (ActionKind.CLICK, ActionKind.SWIPE):
      if action.x is None or action.y is None:
        raise ValueError(f"{kind.value} needs x and y (the touch point); got x={action.x}, y={action.y}")
      x1, y1 = self._to_px(action.x, action.y, action.normalized)
      if kind == ActionKind.CLICK or action.x2 is None or action.y2 is None:
        return [shell + ["tap", str(x1), str(y1)]]
      x2, y2 = self._to_px(action.x2, action.y2, action.normalized)
      if (x2 - x1) ** 2 + (y2 - y1) ** 2 < _TAP_MAX_SQ_DIST:
        return [shell + ["tap", str(x1), str(y1)]]
      return [shell + ["swipe", str(x1), str(y1), str(x2), str(y2), str(self.swipe_ms)]]
    if kind == ActionKind.TYPE:
      cmds = [shell + ["text", _escape_text(action.text)]] if action.text else []
      if action.enter:
        cmds.append(shell + ["keyevent", str(KEYCODE_ENTER)])
      return cmds
    if kind == ActionKind.BACK:
      return [shell + ["keyevent", str(KEYCODE_BACK)]]
    if kind == ActionKind.HOME:
      return [shell + ["keyevent", str(KEYCODE_HOME)]]
    if kind == ActionKind.KEY:
      if action.key.lower() != "enter":
        raise ValueError(f"key={action.key!r}: the AitW device action space has only 'enter' (and back/home)")
      return [shell + ["keyevent", str(KEYCODE_ENTER)]]
    if kind in (ActionKind.NOOP, ActionKind.WAIT, ActionKind.ANSWER, ActionKind.IMPOSSIBLE, ActionKind.INVALID):
      return []
    raise ValueError(f"action kind {kind.value!r} is not in the AitW device action space "
                     "(click/swipe, type, back, home, enter, answer, impossible)")

  def screenshot_command(self) -> list[str]:
    return self._base() + ["exec-out", "screencap", "-p"]

  def run(self, action: Action, timeout_s: float = 30.0) -> None:
    for cmd in self.commands(action):
      subprocess.run(cmd, check=True, capture_output=True, timeout=timeout_s)

  def screenshot(self, timeout_s: float = 30.0) -> np.ndarray:
    from PIL import Image  # pylint: disable=g-import-not-at-top

    png = subprocess.run(self.screenshot_command(), check=True, capture_output=True, timeout=timeout_s).stdout
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint8)
