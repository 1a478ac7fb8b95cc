"""The AutoUI format over the phone's screen as text, for a text decoder (`env.observation=html` in DigiRL).

Why: a small VLM reads nothing of a 64-px phone screenshot (its text is about a pixel tall), while the project's
own base and any Llama-family checkpoint read WebRL's simplified HTML. So the screen reaches the model as that
HTML (compact: WebRL's attributes, no `data-bbox`; `agents.webrl.compact_html`), which the browser-free text
backend renders byte for byte as Chromium does. The accessibility tree is not offered: only Chromium (CDP) makes
it, and it would keep every rollout in a browser. AndroidWorld's text agents read a screen tree the same way.

The prompt is AutoUI's with the page where the VLM's `<image>` marker stands:
`Screen: <page, cut to max_page_chars>\\nPrevious Actions: <last decision> Goal: <task></s>`.

The action space and the parser are AutoUI's (`agents.autoui`), with one addition: a tap may name the page's
element instead of a screen point, `"touch_point": "id=N", "lift_point": "id=N"` in a DUAL_POINT decision (a
text model sees ids, not pixels). It is `click(element=N)`, which the phone executes as a tap at the centre of
element N's live box (Chromium: `BrowserEnv._element_point`, scrolled into view first, as a finger would; the text
backend: the element's default action). Every other decision (point taps and swipes, TYPE into the focused field,
PRESS_ENTER / BACK / HOME, STATUS_TASK_COMPLETE) parses by the original's code, faithful rule included.
"""

from __future__ import annotations

import re
from typing import Sequence

from jaxagent.agents import autoui, base
from jaxagent.agents.webrl import compact_html
from jaxagent.types import Action, ActionKind, Observation, Step, Task

MAX_PAGE_CHARS = 2048  # WebRL's prompt cut (configs/webrl.py: prompt_chars); a phone page is ≤ ~3.2k
_ELEMENT_TAP = re.compile(r'"touch_point": "id=(\d+)", "lift_point": "id=(\d+)"')


def element_tap(index: int) -> str:
  """The decision of a tap on element `index`."""
  points = f'"touch_point": "id={index}", "lift_point": "id={index}"'
  return autoui._decision("DUAL_POINT", points)  # pylint: disable=protected-access


def goal_text(goal: str, previous: Sequence[str] = ()) -> str:
  """The prompt's part after the page: `previous`, the last decision as `history_text` writes it, or none."""
  return "Previous Actions: " + "".join(f"{p} " for p in previous[-1:]) + f"Goal: {goal}</s>"


def screen_prompt(goal: str, page: str, previous: Sequence[str] = ()) -> str:
  """The prompt over a page already cut (to `max_page_chars`)."""
  return f"Screen: {page}\n{goal_text(goal, previous)}"


def _is_element_tap(action: Action) -> bool:
  return action.kind == ActionKind.CLICK and action.element is not None and action.x is None


def history_text(action: Action | None) -> str:
  """An action as the next prompt's `Previous Actions` shows it (`autoui.to_autoui`, element taps included)."""
  return element_tap(action.element) if action is not None and _is_element_tap(action) else autoui.to_autoui(action)


@base.register("autoui_text")
class AutoUIText(autoui.AutoUI):
  """AutoUI's prompt and decisions over the screen's simplified HTML (see the module doc)."""

  name = "autoui_text"

  def __init__(self, faithful_task_impossible: bool = False, max_page_chars: int = MAX_PAGE_CHARS):
    """`max_page_chars`: where the page is cut, so that the goal after it always fits the model's context."""
    super().__init__(faithful_task_impossible)
    self.max_page_chars = int(max_page_chars)

  def turns(self, observation: Observation, history: Sequence[Step]) -> tuple[list[dict[str, str]], list]:
    """One human turn holding the whole prompt; no image."""
    return [base.human_turn(self.build_prompt(observation.intent, observation, history))], []

  def build_prompt(self, task: Task | str, observation: Observation | None, history: Sequence[Step]) -> str:
    """`observation` None (the state after an episode's last step, whose page no store keeps): no page."""
    page = compact_html(observation.html)[:self.max_page_chars] if observation is not None else ""
    return screen_prompt(base.task_intent(task), page, [history_text(s.action) for s in list(history)[-1:]])

  def _parse(self, text: str) -> Action:
    tap = _ELEMENT_TAP.search(text.split("Action Decision: ", 1)[-1]) if "Action Decision: " in text else None
    if tap is not None and '"action_type": "DUAL_POINT"' in text:
      touch, lift = int(tap.group(1)), int(tap.group(2))
      if touch != lift:
        return Action.invalid(f"Action {text} taps two elements ({touch} and {lift}); a tap names one")
      return Action(ActionKind.CLICK, element=touch)
    return super()._parse(text)

  def render(self, action: Action, thought: str = "") -> str:
    if _is_element_tap(action):
      return f"Action Plan: [{thought or 'DUAL_POINT'}] ; Action Decision: {element_tap(action.element)}"
    return super().render(action, thought)
