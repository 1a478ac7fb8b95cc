"""Properties of every agent format: parsers never raise, malformed output becomes `invalid` with the
originals' error text, and `parse(render(a)) == a` for every kind a format supports."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxagent.agents import format_names, get_format
from jaxagent.agents import webvoyager_prompts as P
from jaxagent.types import Action, ActionKind

FORMATS = {name: get_format(name) for name in format_names()}
FORMATS["webrl_extended"] = get_format("webrl", extended_actions=True)
FORMATS["autoui_faithful"] = get_format("autoui", faithful_task_impossible=True)

# The error texts each original produces for malformed output (nothing else may appear).
_WV = rf"^({re.escape(P.FORMAT_ERROR)}|{re.escape(P.FAIL_OBS_WEBVOYAGER)})$"
_OWV = rf"^({re.escape(P.FORMAT_ERROR)}|{re.escape(P.FAIL_OBS_OPENWEBVOYAGER)})$"
_WEBRL = r"^(No action specified: |Invalid action |Invalid element id |KeyError: |AttributeError: |TypeError: )"
_AUTOUI = r"(Failed to translate action: .*, terminating the environment$|^Action .* Parsing Error: |^Action .* not supported yet\.$)"
_AUTOUI_TEXT = rf"({_AUTOUI}|^Action .* taps two elements \(\d+ and \d+\); a tap names one$)"
ERRORS = {"webvoyager": _WV, "webvoyager_text": _WV, "webvoyager_actree_image": _OWV, "openwebvoyager": _OWV,
          "openwebvoyager_compact": _OWV,
          "webrl": _WEBRL, "webrl_extended": _WEBRL, "autoui": _AUTOUI, "autoui_faithful": _AUTOUI,
          "autoui_text": _AUTOUI_TEXT}

# Derandomized so CI is reproducible; 1500 random examples per test passed when this was written.
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

# Near misses: fragments of every grammar, glued together with noise.
_FRAGMENTS = ["Thought:", "Action:", "Observation:", "Click [", "Click ", "Type [", "]; ", "Scroll [WINDOW]; ",
              "up", "down", "Wait", "GoBack", "Google", "Restart", "ANSWER", "; ", ": ", "[", "]", "\n", "12", "x",
              "do(", "exit(", "go_backward(", "go_forward()", "action=", "element=", "argument=", "message=", '"',
              "'", ")", ",", "# Element: ", "Click", "Search", "Scroll Up", "Press Enter", "Select Dropdown Option",
              "find_element_by_instruction(instruction=", "lambda: 0", "1e999", "__import__('os')",
              "Action Plan: [", "Action Decision: ", '"action_type": ', '"DUAL_POINT"', '"TYPE"', '"touch_point": ',
              '"[0.5, 0.5]"', '"id=3"', '"id=12"', '"lift_point": ', '"typed_text": ', '"STATUS_TASK_COMPLETE"', '"TASK_IMPOSSIBLE"',
              ", ", "nan", "-1.0", "<|eot_id|>", "\x00", "é", "\u2028"]
near_miss = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=5)), max_size=14).map("".join)


def _check(name, text):
  action = FORMATS[name].parse(text)
  assert isinstance(action, Action)
  if action.kind == ActionKind.INVALID:
    assert re.search(ERRORS[name], action.reason, re.DOTALL), (name, text, action.reason)
  return action


@pytest.mark.slow
@SETTINGS
@given(st.text(max_size=200))
def test_no_parser_raises_on_any_text(text):
  for name in FORMATS:
    _check(name, text)


@SETTINGS
@given(near_miss)
def test_no_parser_raises_on_near_misses(text):
  for name in FORMATS:
    _check(name, text)


def test_non_string_output_is_invalid_not_an_exception():
  for fmt in FORMATS.values():
    assert fmt.parse(None).kind == ActionKind.INVALID  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ round trips

_elements = st.integers(0, 5000)
# WebVoyager content: regex `.[^\]]*` after `[; ]+`, reply stripped, and later regexes searched first.
_wv_text = st.text(st.characters(blacklist_characters="][\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
                                 blacklist_categories=("Cs", "Zs", "Cc")), min_size=1, max_size=30).filter(
                                     lambda s: not re.search(r"Click|Type|Scroll|Thought:|Action:|Observation:", s))


def _wv_actions():
  return {
      ActionKind.CLICK: st.builds(lambda e: Action(ActionKind.CLICK, element=e), _elements),
      ActionKind.TYPE: st.builds(lambda e, t: Action(ActionKind.TYPE, element=e, text=t, enter=True), _elements,
                                 _wv_text),
      ActionKind.SCROLL: st.builds(lambda e, d: Action(ActionKind.SCROLL, element=e, direction=d),
                                   st.none() | _elements, st.sampled_from(["up", "down"])),
      ActionKind.WAIT: st.just(Action(ActionKind.WAIT)),
      ActionKind.BACK: st.just(Action(ActionKind.BACK)),
      ActionKind.RESTART: st.just(Action(ActionKind.RESTART)),
      ActionKind.ANSWER: st.builds(lambda t: Action(ActionKind.ANSWER, text=t), _wv_text),
  }


# WebRL arguments: any text except the comment stripper's keys (a faithful quirk, tested in test_webrl.py).
_webrl_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30).filter(
    lambda s: not any(k in s for k in ("exit(", "do(", "go_backward(")))


def _webrl_actions(extended):
  kinds = {
      ActionKind.CLICK: st.builds(lambda e: Action(ActionKind.CLICK, element=e), _elements),
      ActionKind.HOVER: st.builds(lambda e: Action(ActionKind.HOVER, element=e), _elements),
      ActionKind.TYPE: st.builds(lambda e, t, n: Action(ActionKind.TYPE, element=e, text=t, enter=n), _elements,
                                 _webrl_text, st.booleans()),
      ActionKind.SELECT: st.builds(lambda e, t: Action(ActionKind.SELECT, element=e, text=t), _elements, _webrl_text),
      ActionKind.SCROLL: st.builds(lambda d: Action(ActionKind.SCROLL, direction=d), st.sampled_from(["up", "down"])),
      ActionKind.KEY: st.just(Action(ActionKind.KEY, key="Enter")),
      ActionKind.BACK: st.just(Action(ActionKind.BACK)),
      ActionKind.FORWARD: st.just(Action(ActionKind.FORWARD)),
      ActionKind.ANSWER: st.builds(lambda t: Action(ActionKind.ANSWER, text=t), _webrl_text),
  }
  if extended:
    kinds[ActionKind.WAIT] = st.just(Action(ActionKind.WAIT))
  return kinds


_unit = st.integers(0, 10000).map(lambda i: i / 10000)  # AutoUI writes 4 decimals
# AutoUI typed_text: the decision is split on ", " and quotes are stripped from the ends.
_autoui_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30).filter(
    lambda s: ", " not in s and not s.startswith('"') and not s.endswith('"') and ": " not in s)


def _autoui_actions():
  return {
      ActionKind.CLICK: st.builds(lambda x, y: Action(ActionKind.CLICK, x=x, y=y, normalized=True), _unit, _unit),
      ActionKind.SWIPE: st.builds(lambda x, y, x2, y2: Action(ActionKind.SWIPE, x=x, y=y, x2=x2, y2=y2, normalized=True),
                                  _unit, _unit, _unit, _unit).filter(lambda a: (a.x, a.y) != (a.x2, a.y2)),
      ActionKind.TYPE: st.builds(lambda t: Action(ActionKind.TYPE, text=t), _autoui_text),
      ActionKind.KEY: st.just(Action(ActionKind.KEY, key="Enter")),
      ActionKind.BACK: st.just(Action(ActionKind.BACK)),
      ActionKind.HOME: st.just(Action(ActionKind.HOME)),
      ActionKind.ANSWER: st.just(Action(ActionKind.ANSWER)),
      ActionKind.IMPOSSIBLE: st.just(Action(ActionKind.IMPOSSIBLE)),
  }


_thought = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20).filter(
    lambda s: not re.search(r"Thought:|Action:|Observation:|exit\(|do\(|go_backward\(", s))

STRATEGIES = {
    "webvoyager": _wv_actions(), "webvoyager_text": _wv_actions(), "webvoyager_actree_image": _wv_actions(),
    "openwebvoyager": _wv_actions(), "webrl": _webrl_actions(False), "webrl_extended": _webrl_actions(True),
    "autoui": _autoui_actions(), "autoui_faithful": _autoui_actions(),
}


def test_round_trip_strategies_cover_every_supported_kind():
  for name, by_kind in STRATEGIES.items():
    assert set(by_kind) == set(FORMATS[name].supported_kinds), name


@SETTINGS
@given(st.data())
def test_round_trip(data):
  for name, strategy in STRATEGIES.items():
    action = data.draw(st.one_of(*strategy.values()), label=name)
    thought = "" if name.startswith("autoui") else data.draw(_thought, label="thought")
    text = FORMATS[name].render(action, thought)
    assert FORMATS[name].parse(text) == action, (name, text)
