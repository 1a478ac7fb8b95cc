"""WebRL format: the Llama-3 completion prompt, `create_webrl_id_based_action`, the ORM input."""

import warnings

import pytest

from jaxagent.agents import get_format
from jaxagent.agents import webrl
from jaxagent.types import Action, ActionKind, Observation, Step, Task

U = "<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
A = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"


def test_prompt_golden_three_rounds():
  fmt = get_format("webrl")
  task = Task(id="1", intent="Show the top-3 products", site="shop", start_url="/")
  hist = [Step(step=0, action_text='do(action="Click", element="7")'),
          Step(step=1, action_text='# Element: the search bar\ndo(action="Search", argument="x", element="13")')]
  prompt = fmt.build_prompt(task, Observation(html='<html data-bbox="0,0,1280,720"> </html>'), hist)
  assert prompt == (
      "Task Instruction: Show the top-3 products\n\n"
      f"Round 0\n\n{U}Show the top-3 products\n\n{A}do(action=\"Click\", element=\"7\")\n\n"
      f"Round 1\n\n{U}** Simplified html **\n\n{A}# Element: the search bar\ndo(action=\"Search\", argument=\"x\", "
      "element=\"13\")\n\n"
      f"Round 2\n\n{U}<html data-bbox=\"0,0,1280,720\"> </html>\n\n{A}")
  first = fmt.build_prompt(task, Observation(html="<html/>"), [])
  assert first == f"Task Instruction: Show the top-3 products\n\nRound 0\n\n{U}<html/>\n\n{A}"


def test_prompt_truncates_html_to_16384_minus_512_chars():
  html = "~" * 20000
  prompt = webrl.webrl_prompt("do it", ["exit()"], html)
  history_len = len(f"Round 0\n\n{U}do it\n\n{A}exit()\n\n")
  assert prompt.count("~") == 16384 - 512 - history_len
  # The original's negative slice when the history alone is longer than the budget.
  long_actions = ["y" * 9000, "z" * 9000]
  assert webrl.webrl_prompt("t", long_actions, "abcdef").count("abcdef") == 0


@pytest.mark.parametrize("text,expected", [
    ('# Element: the \'REPORTS\' section on the left sidebar\ndo(action="Click", element="7")',
     Action(ActionKind.CLICK, element=7)),
    ('do(action="Type", argument="01/01/2023", element="22")',
     Action(ActionKind.TYPE, element=22, text="01/01/2023")),
    ('# Element: The search bar\ndo(action="Search", argument="international airport", element="13")',
     Action(ActionKind.TYPE, element=13, text="international airport", enter=True)),
    ('# Element: the \'Period\' dropdown, middle center\ndo(action="Select Dropdown Option", argument="Month", element="20")',
     Action(ActionKind.SELECT, element=20, text="Month")),
    ('do(action="Scroll Down")', Action(ActionKind.SCROLL, direction="down")),
    ('do(action="Scroll Up")', Action(ActionKind.SCROLL, direction="up")),
    ('do(action="Press Enter")', Action(ActionKind.KEY, key="Enter")),
    ('do(action="Hover", element="5")', Action(ActionKind.HOVER, element=5)),
    ('do(action="Go Backward")', Action(ActionKind.BACK)),
    ('do(action="Go Forward")', Action(ActionKind.FORWARD)),
    ('exit(message="The top-3 best-selling products in January 2023 are: 1")',
     Action(ActionKind.ANSWER, text="The top-3 best-selling products in January 2023 are: 1")),
    ('# Note: Pittsburgh International Airport\n# Element: The field\ndo(action="Type", argument="Cleveland", element="14")',
     Action(ActionKind.TYPE, element=14, text="Cleveland")),
    ('do(action="Click", element=7)<|eot_id|>', Action(ActionKind.CLICK, element=7)),
])
def test_parser_golden(text, expected):
  assert get_format("webrl").parse(text) == expected


@pytest.mark.parametrize("text,reason", [
    ("go_backward()", "Invalid action go_backward()"),  # the original has no branch for it
    ('do(action="Wait")', 'Invalid action do(action="Wait")'),
    ('do(action="Right Click", element="3")', 'Invalid action do(action="Right Click", element="3")'),
    ("do(action=Click)", "No action specified: do(action=Click)"),  # not a literal: never evaluated
    ("do(action=__import__('os').system('true'))", "No action specified: do(action=__import__('os').system('true'))"),
    ('# only a comment', "No action specified: # only a comment"),
    ('do(action="Type", argument="call exit(now)", element="3")',  # comment stripping cuts at `exit(`
     'No action specified: do(action="Type", argument="call exit(now)", element="3")'),
    ('do(action="Click")', "KeyError: 'kwargs'"),
    ("exit()", "KeyError: 'kwargs'"),
    ('do(action="Click", element="submit")', "Invalid element id 'submit'"),
])
def test_parser_errors_carry_the_original_text(text, reason):
  action = get_format("webrl").parse(text)
  assert action.kind == ActionKind.INVALID
  assert action.reason.startswith(reason)


def test_extended_actions_flag():
  fmt = get_format("webrl", extended_actions=True)
  assert fmt.parse("go_backward()") == Action(ActionKind.BACK)
  assert fmt.parse("# back\ngo_forward()") == Action(ActionKind.FORWARD)
  assert fmt.parse('do(action="Wait")') == Action(ActionKind.WAIT)
  assert fmt.render(Action(ActionKind.BACK)) == "go_backward()"
  assert get_format("webrl").render(Action(ActionKind.BACK)) == 'do(action="Go Backward")'


def test_render_escapes_and_comments():
  fmt = get_format("webrl")
  a = Action(ActionKind.TYPE, element=3, text='say "hi"\nthen \\ leave')
  s = fmt.render(a, "Element: the box")
  assert s == '# Element: the box\ndo(action="Type", argument="say \\"hi\\"\\nthen \\\\ leave", element="3")'
  assert fmt.parse(s) == a
  assert webrl.training_target("exit()") == "exit()<|eot_id|>" == webrl.training_target("exit()<|eot_id|>")


def test_orm_prompt_golden():
  prompt = webrl.orm_prompt(" Find the price ", ['# Element: x\ndo(action="Click", element="1")', 'exit(message="3")'],
                            " <html> </html> ")
  assert prompt == (
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are an expert in evaluating the performance "
      "of a website navigation agent. The agent is designed to help a human user navigate the website to complete a "
      "task. Given the user\u2019s intent, the agent's action history, and the final state of the screen, your goal is "
      "to decide whether the agent\u2019s execution is successful or not. You must respond with YES or NO.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nThe User Intent:\nFind the price\n\nAction History:\n"
      "# Element: x; do(action=\"Click\", element=\"1\")\nexit(message=\"3\")\n\nThe Current Screenshot:\n"
      "<html> </html><|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


# ------------------------------------------------- early stop (VAB-WebArena-Lite/new/run.py:early_stop)

CLICK = '# Element: the cart\ndo(action="Click", element="7")'


def _steps(*texts):
  """Steps as the collector records them: the raw reply and its parse."""
  fmt = get_format("webrl")
  return [Step(step=i, action_text=t, action=fmt.parse(t)) for i, t in enumerate(texts)]


def test_early_stop_after_5_consecutive_parse_failures():
  garbage = [f"I think I should click {i}" for i in range(5)]  # all different: no repeat
  assert all(s.action.kind == ActionKind.INVALID for s in _steps(*garbage))
  assert webrl.early_stop(_steps(*garbage[:4])) == ""
  assert webrl.early_stop(_steps(*garbage)) == "Failed to parse actions for 5 times"
  # the last 5 only: a valid action earlier does not matter, one among the last 5 resets the count
  assert webrl.early_stop(_steps(CLICK, *garbage)) == "Failed to parse actions for 5 times"
  assert webrl.early_stop(_steps(*garbage[:2], CLICK, *garbage[2:])) == ""
  assert webrl.early_stop(_steps(*garbage[:2], CLICK, *garbage[2:], "more junk")) == ""
  assert webrl.early_stop(_steps(*garbage[:2], CLICK, *garbage[2:], "more junk", "and more")) != ""


def test_early_stop_after_5_identical_replies_compared_as_raw_text():
  assert webrl.early_stop(_steps(*[CLICK] * 4)) == ""
  assert webrl.early_stop(_steps(*[CLICK] * 5)) == "Same action for 5 times"
  assert webrl.early_stop(_steps('do(action="Scroll Down")', *[CLICK] * 5)) == "Same action for 5 times"
  # consecutive only: another reply in between resets it
  assert webrl.early_stop(_steps(*[CLICK] * 3, 'do(action="Scroll Down")', *[CLICK] * 2)) == ""
  # the same action with another comment is another string (VAB compares `raw_prediction`)
  other_comment = '# Element: the cart icon\ndo(action="Click", element="7")'
  assert get_format("webrl").parse(other_comment) == get_format("webrl").parse(CLICK)
  assert webrl.early_stop(_steps(*[CLICK] * 4, other_comment)) == ""
  # the same garbage five times is a parse failure first (that rule is checked first)
  assert webrl.early_stop(_steps(*["junk"] * 5)) == "Failed to parse actions for 5 times"
  assert webrl.early_stop(_steps(*["junk"] * 5), parse_failures=0) == "Same action for 5 times"


def test_early_stop_thresholds_and_zero_turns_a_rule_off():
  assert webrl.early_stop(_steps(*["a", "b", "c"]), parse_failures=3) == "Failed to parse actions for 3 times"
  assert webrl.early_stop(_steps(*[CLICK] * 2), repeats=2) == "Same action for 2 times"
  assert webrl.early_stop(_steps(*[CLICK] * 9), repeats=0) == ""
  assert webrl.early_stop(_steps(*["junk"] * 9), parse_failures=0, repeats=0) == ""
  assert webrl.early_stop([]) == ""



def _parse_warning_free(text):
  """The parse under `-W error`, and the warnings the same parse issues when every warning is shown."""
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    action = get_format("webrl").parse(text)
  with warnings.catch_warnings(record=True) as shown:
    warnings.simplefilter("always")
    get_format("webrl").parse(text)
  return action, [str(w.message) for w in shown]


@pytest.mark.parametrize("text, expected", [
    ('do(action="Type", element="3", argument="\\d+ items")', Action(ActionKind.TYPE, element=3, text="\\d+ items")),
    ('do(action="Search", element="12", argument="price \\s")',
     Action(ActionKind.TYPE, element=12, text="price \\s", enter=True)),
    ('exit(message="matches \\w")', Action(ActionKind.ANSWER, text="matches \\w")),
])
def test_invalid_escapes_in_a_reply_parse_as_written_without_a_warning(text, expected):
  """Model text like "\\d" is an invalid escape to Python's compiler: the original keeps it as written (with a
  SyntaxWarning, a DeprecationWarning before 3.12); parsing it keeps it and warns about nothing."""
  assert _parse_warning_free(text) == (expected, [])


def test_a_malformed_number_in_a_reply_is_invalid_without_a_warning():
  """`1if` is an "invalid decimal literal" warning to the compiler, then no literal: invalid, as the original."""
  text = 'do(action="Type", element=1if 1 else 2, argument="x")'
  action, shown = _parse_warning_free(text)
  assert action == Action.invalid(f"No action specified: {text}") and shown == []
