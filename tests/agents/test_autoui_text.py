"""The AutoUI format over the phone's simplified HTML: AutoUI's prompt with the page where the image stood, its
decisions parsed by the original's code, and a tap that names an element (`agents/autoui_text.py`)."""

import pytest

from jaxagent.agents import autoui, get_format, spec
from jaxagent.agents.autoui_text import AutoUIText, element_tap
from jaxagent.types import Action, ActionKind, Observation, Step

PAGE = ('<html> <body> <a id="0" href="/s/x/shop/" data-bbox="1,2,3,4"> Shop </a> <button id="1"> Go </button> '
        '</body> </html>')


@pytest.mark.parametrize("action", [
    Action(ActionKind.CLICK, element=7),
    Action(ActionKind.TYPE, text="red shoes"),
    Action(ActionKind.KEY, key="Enter"),
    Action(ActionKind.BACK), Action(ActionKind.HOME), Action(ActionKind.ANSWER),
    Action(ActionKind.SWIPE, x=0.5, y=0.75, x2=0.5, y2=0.25, normalized=True),
    Action(ActionKind.CLICK, x=0.25, y=0.5, normalized=True),
])
def test_every_phone_action_renders_and_parses_back(action):
  fmt = AutoUIText()
  parsed = fmt.parse(fmt.render(action))
  assert (parsed.kind, parsed.element, parsed.text, parsed.x, parsed.y, parsed.x2, parsed.y2) == (
      action.kind, action.element, action.text, action.x, action.y, action.x2, action.y2)


def test_an_element_tap_is_a_dual_point_decision_naming_the_id():
  text = AutoUIText().render(Action(ActionKind.CLICK, element=12))
  assert text == ('Action Plan: [DUAL_POINT] ; Action Decision: "action_type": "DUAL_POINT", "touch_point": "id=12", '
                  '"lift_point": "id=12", "typed_text": ""')
  assert AutoUIText().parse(text.replace('"lift_point": "id=12"', '"lift_point": "id=3"')).kind == ActionKind.INVALID


def test_other_decisions_parse_by_the_originals_rule():
  garbage = "Action Plan: [TYPE] no decision here"
  assert AutoUIText(faithful_task_impossible=True).parse(garbage).kind == ActionKind.IMPOSSIBLE
  assert AutoUIText().parse(garbage).kind == ActionKind.INVALID
  point = autoui.AutoUI().render(Action(ActionKind.CLICK, x=0.1, y=0.2, normalized=True))
  assert AutoUIText().parse(point) == autoui.AutoUI().parse(point)


def test_the_prompt_is_autouis_with_the_compact_page_where_the_image_stood():
  obs = Observation(html=PAGE, intent="Open the shop")
  history = [Step(step=0, action=Action(ActionKind.CLICK, element=0), action_text="")]
  fmt = AutoUIText(max_page_chars=60)
  turns, images = fmt.turns(obs, history)
  prompt = turns[0]["value"]
  assert images == [] and "<image>" not in prompt and len(turns) == 1
  page = '<html> <body> <a id="0"> Shop </a> <button id="1"> Go </button> </body> </html>'[:60]
  assert prompt == f"Screen: {page}\nPrevious Actions: {element_tap(0)} Goal: Open the shop</s>"
  assert fmt.build_prompt("Open the shop", None, []) == "Screen: \nPrevious Actions: Goal: Open the shop</s>"


def test_the_format_and_its_page_cut_survive_agent_json():
  fmt = AutoUIText(faithful_task_impossible=True, max_page_chars=500)
  back = spec.from_spec(spec.to_spec(fmt, None))
  assert isinstance(back, AutoUIText) and back.max_page_chars == 500 and back.parse_rule == "faithful"
  assert isinstance(get_format("autoui_text"), AutoUIText)
