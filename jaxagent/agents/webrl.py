"""WebRL's agent format: Llama-3 completion prompt over simplified HTML, python-call actions, ORM input.

Sources (`reference/algorithms.md` §3.3–3.6):
  * prompt: THUDM/VisualAgentBench:VAB-WebArena-Lite/new/prompt_constructor.py:WebRLPromptConstructor,
    identical to THUDM/WebRL:scripts/process_data.py:format_prompt (training side);
  * parser: VAB-WebArena-Lite/new/actions.py:create_webrl_id_based_action, ported line by line
    (`ast.parse(mode='eval')` + `ast.literal_eval`, never `eval`);
  * ORM input: THUDM/WebRL:scripts/process_data.py:rm_format and add_overall_reward;
  * early stop: VAB-WebArena-Lite/new/run.py:early_stop (`early_stop`).

Faithful quirks kept (and tested):
  * comment stripping returns the text after the LAST occurrence of the first of `exit(`, `do(`,
    `go_backward(` found, so a comment or argument containing `exit(` breaks the action;
  * the original parser has no branch for `go_backward()`, `go_forward()` or `do(action="Wait")` although
    the prompt offers them: they are `invalid` ("Invalid action ...") unless `extended_actions=True`;
  * past HTML is replaced by `** Simplified html **`, round 0's user content is the intent, and the HTML
    is cut when history + HTML exceed 16384 - 512 characters (a negative slice when the history alone is
    longer, exactly as the original).
"""

from __future__ import annotations

import ast
import json
import re
import threading
import warnings
from typing import Any, Sequence

from jaxagent.agents import base
from jaxagent.types import Action, ActionKind, Observation, Step, Task

EOT = "<|eot_id|>"
SIMPLIFIED_HTML = "** Simplified html **"
MAX_PROMPT_CHARS = 16384 - 512
_USER = "<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
_ASSISTANT = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"


def webrl_prompt(intent: str, previous_actions: Sequence[str], html: str, max_chars: int = MAX_PROMPT_CHARS) -> str:
  """`WebRLPromptConstructor.construct`: rounds 0..t-1 with their actions, then round t's HTML, cut so that history
  and HTML hold at most `max_chars` characters (the original's 16384 − 512)."""
  index = len(previous_actions)
  history = ""
  for i in range(index - 1, -1, -1):
    user = intent if i == 0 else SIMPLIFIED_HTML
    history = f"Round {i}\n\n{_USER}{user}\n\n{_ASSISTANT}{previous_actions[i]}\n\n" + history
  if len(history) + len(html) > max_chars:
    html = html[:max_chars - len(history)]
  current_turn = f"Round {index}\n\n{_USER}{html}\n\n{_ASSISTANT}"
  return f"Task Instruction: {intent}\n\n{history}{current_turn}"


def current_html(prompt: str) -> str:
  """The current round's HTML in a `webrl_prompt` (the ORM's "final screen" is the last step's)."""
  head = prompt.rfind(_USER)
  tail = prompt.rfind("\n\n" + _ASSISTANT)
  return prompt[head + len(_USER):tail] if 0 <= head < tail else ""


# The attributes our observer writes beyond WebRL's HtmlParser list (title, value, type, placeholder, selected,
# data-value, data-text, data-testid, data-label, data-bbox, data-status), and data-bbox.
_EXTRA_ATTRS = re.compile(r' (?:href|aria-label|name|checked|data-bbox)="[^"]*"')


def compact_html(html: str) -> str:
  """The simplified HTML with the original parser's attributes only and without `data-bbox`: about half the
  tokens, the element ids and texts unchanged."""
  return _EXTRA_ATTRS.sub("", html)


def early_stop(steps: Sequence[Step], parse_failures: int = 5, repeats: int = 5) -> str:
  """VAB `run.py:early_stop` as WebRL's evaluation runs it (`wa_parallel_run_webrl.sh`: both thresholds 5, and
  `actions` passed): the reason to end the episode, or "" to go on.

  Both rules look at the last k steps only (consecutive): k parse failures (`invalid` actions), checked first;
  k replies equal to the last one as raw text (for `webrl_id` the compared action string is the model's
  `raw_prediction`, so the comment lines count and parse failures are compared too). k = 0 turns a rule off
  (the original would stop at once)."""
  if parse_failures > 0 and len(steps) >= parse_failures and all(
      s.action is not None and s.action.kind == ActionKind.INVALID for s in steps[-parse_failures:]):
    return f"Failed to parse actions for {parse_failures} times"
  if repeats > 0 and len(steps) >= repeats and all(s.action_text == steps[-1].action_text for s in steps[-repeats:]):
    return f"Same action for {repeats} times"
  return ""


def training_target(action_text: str) -> str:
  """The SFT/RL target: the action string ending with `<|eot_id|>` (the trainer appends it if missing)."""
  return action_text if action_text.endswith(EOT) else action_text + EOT


# -------------------------------------------------------------------------------------------- ORM

ORM_SYSTEM_PROMPT = (
    "You are an expert in evaluating the performance of a website navigation agent. The agent is designed to help a "
    "human user navigate the website to complete a task. Given the user\u2019s intent, the agent's action history, "
    "and the final state of the screen, your goal is to decide whether the agent\u2019s execution is successful or "
    "not. You must respond with YES or NO.")


def orm_user_content(intent: str, responses: Sequence[str], last_html: str) -> str:
  """`rm_format`: intent, every response with newlines as '; ', then the HTML seen before the last action."""
  text = "The User Intent:\n" + intent.strip() + "\n\n" + "Action History:\n"
  for response in responses:
    text += "; ".join(response.split("\n")).strip() + "\n"
  return text + "\n" + "The Current Screenshot:\n" + last_html.strip()


def orm_prompt(intent: str, responses: Sequence[str], last_html: str) -> str:
  """The ORM's full Llama-3 input (`add_overall_reward`); score = softmax(logit[YES], logit[NO])[YES]."""
  user = orm_user_content(intent, responses, last_html)
  return (f"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{ORM_SYSTEM_PROMPT}{EOT}"
          f"<|start_header_id|>user<|end_header_id|>\n\n{user}{EOT}<|start_header_id|>assistant<|end_header_id|>\n\n")


# ----------------------------------------------------------------------------------------- parser


class ActionParsingError(Exception):
  pass


def remove_comments(code: str) -> str:
  for key in ("exit(", "do(", "go_backward("):
    if key in code:
      return key + code.split(key)[-1]
  lines = code.split("\n")
  for i, line in enumerate(lines):
    if not line.strip().startswith("#"):
      return "\n".join(lines[i:])
  return ""


_COMPILER_WARNINGS = threading.Lock()  # `warnings.catch_warnings` swaps process-wide state: one parse at a time


def _parse_quietly(expression: str) -> ast.Expression:
  """`ast.parse(mode="eval")` without the compiler's warnings: model text such as `"\\d+"` (an invalid escape,
  kept as written) or `1if` would print a SyntaxWarning (a DeprecationWarning before 3.12) per reply, and under
  `-W error` fail a reply the original reads."""
  with _COMPILER_WARNINGS, warnings.catch_warnings():
    warnings.simplefilter("ignore", SyntaxWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    return ast.parse(expression, mode="eval")


def parse_function_call(expression: str) -> dict[str, Any]:
  """`parse_function_call`: {"operation", "action"?, "kwargs"?} from one python-style call."""
  expression = remove_comments(expression).strip()
  tree = _parse_quietly(expression)
  func_call = tree.body
  if not isinstance(func_call, ast.Call):
    return {"operation": expression}
  func_name = func_call.func.id  # AttributeError for `a.b()`, as in the original
  result: dict[str, Any] = {"operation": func_name}
  for kw in func_call.keywords:
    if func_name == "do" and kw.arg == "action":
      result["action"] = ast.literal_eval(kw.value)
      continue
    kwargs = result.setdefault("kwargs", {})
    if kw.arg == "element":
      try:
        inner = kw.value
        if isinstance(inner, ast.Call) and inner.func.id == "find_element_by_instruction":
          for inner_kw in inner.keywords:
            if inner_kw.arg == "instruction":
              kwargs["instruction"] = ast.literal_eval(inner_kw.value)
        else:
          kwargs[kw.arg] = ast.literal_eval(inner)
      except Exception:  # pylint: disable=broad-except  # the original retries the plain literal
        kwargs[kw.arg] = ast.literal_eval(kw.value)
    else:
      kwargs[kw.arg] = ast.literal_eval(kw.value)
  return result


def create_webrl_action(action_str: str, extended_actions: bool = False) -> dict[str, Any]:
  """`create_webrl_id_based_action` -> {"type", ...} (raises ActionParsingError / KeyError like the original)."""
  action_str = action_str.strip()
  try:
    action = parse_function_call(action_str)
  except Exception as e:  # pylint: disable=broad-except
    raise ActionParsingError(f"No action specified: {action_str}") from e
  operation = action["operation"]
  if operation == "do":
    action_type = action["action"].lower()
    kwargs = lambda: action["kwargs"]  # noqa: E731  (KeyError: 'kwargs' only where the original raises it)
    if action_type == "press enter":
      return {"type": "key_press", "key_comb": "enter"}
    if action_type in ("scroll up", "scroll down"):
      return {"type": "scroll", "direction": action_type.split()[1]}
    if action_type in ("click", "hover"):
      return {"type": action_type, "element_id": kwargs()["element"]}
    if action_type in ("type", "search"):
      return {"type": action_type, "element_id": kwargs()["element"], "text": kwargs()["argument"]}
    if action_type == "select dropdown option":
      return {"type": "select_dropdown_option", "element_id": kwargs()["element"], "argument": kwargs()["argument"]}
    if action_type == "go forward":
      return {"type": "go_forward"}
    if action_type == "go backward":
      return {"type": "go_back"}
    if extended_actions and action_type == "wait":
      return {"type": "wait"}
  elif operation == "exit":
    return {"type": "stop", "answer": action["kwargs"]["message"]}
  elif extended_actions and operation in ("go_backward", "go_forward"):
    return {"type": "go_back" if operation == "go_backward" else "go_forward"}
  raise ActionParsingError(f"Invalid action {action_str}")


def _element(value: Any, action_str: str) -> int:
  text = str(value).strip()
  if not text.isdigit():
    raise ActionParsingError(f"Invalid element id {value!r} (jaxagent needs a numeric html id): {action_str}")
  return int(text)


def to_action(parsed: dict[str, Any], action_str: str) -> Action:
  t = parsed["type"]
  if t == "key_press":
    return Action(ActionKind.KEY, key="Enter")
  if t == "scroll":
    return Action(ActionKind.SCROLL, direction=parsed["direction"])
  if t == "click":
    return Action(ActionKind.CLICK, element=_element(parsed["element_id"], action_str))
  if t == "hover":
    return Action(ActionKind.HOVER, element=_element(parsed["element_id"], action_str))
  if t in ("type", "search"):
    return Action(ActionKind.TYPE, element=_element(parsed["element_id"], action_str), text=str(parsed["text"]),
                  enter=t == "search")
  if t == "select_dropdown_option":
    return Action(ActionKind.SELECT, element=_element(parsed["element_id"], action_str), text=str(parsed["argument"]))
  if t == "go_back":
    return Action(ActionKind.BACK)
  if t == "go_forward":
    return Action(ActionKind.FORWARD)
  if t == "wait":
    return Action(ActionKind.WAIT)
  return Action(ActionKind.ANSWER, text=str(parsed["answer"]))


def _quote(text: str) -> str:
  return json.dumps(text, ensure_ascii=False)  # a double-quoted literal `ast.literal_eval` reads back


def render_call(action: Action, extended_actions: bool = False) -> str:
  k = action.kind
  el = f'element="{action.element}"'
  if k == ActionKind.CLICK and action.element is not None:
    return f'do(action="Click", {el})'
  if k == ActionKind.HOVER and action.element is not None:
    return f'do(action="Hover", {el})'
  if k == ActionKind.TYPE and action.element is not None:
    name = "Search" if action.enter else "Type"
    return f'do(action="{name}", argument={_quote(action.text)}, {el})'
  if k == ActionKind.SELECT and action.element is not None:
    return f'do(action="Select Dropdown Option", argument={_quote(action.text)}, {el})'
  if k == ActionKind.SCROLL and action.element is None and action.direction in ("up", "down"):
    return f'do(action="Scroll {action.direction.capitalize()}")'
  if k == ActionKind.KEY and action.key.lower() == "enter":
    return 'do(action="Press Enter")'
  if k == ActionKind.BACK:
    return "go_backward()" if extended_actions else 'do(action="Go Backward")'
  if k == ActionKind.FORWARD:
    return "go_forward()" if extended_actions else 'do(action="Go Forward")'
  if k == ActionKind.WAIT and extended_actions:
    return 'do(action="Wait")'
  if k == ActionKind.ANSWER:
    return f"exit(message={_quote(action.text)})"
  raise ValueError(f"WebRL has no action for {action.to_json()} (extended_actions={extended_actions})")


@base.register("webrl")
class WebRL(base.AgentFormat):
  """Completion-mode WebRL (Llama-3.1-8B / GLM-4-9B actors)."""

  name = "webrl"
  _KINDS = frozenset({ActionKind.CLICK, ActionKind.HOVER, ActionKind.TYPE, ActionKind.SELECT, ActionKind.SCROLL,
                      ActionKind.KEY, ActionKind.BACK, ActionKind.FORWARD, ActionKind.ANSWER})

  def __init__(self, extended_actions: bool = False, compact: bool = False, max_prompt_chars: int = MAX_PROMPT_CHARS,
               stop_parse_failures: int = 0, stop_repeats: int = 0):
    """`compact`: the HTML through `compact_html`; `max_prompt_chars`: where the prompt cuts the HTML (both
    departures for short contexts; the defaults are the original's). `stop_parse_failures`, `stop_repeats`: the
    thresholds of VAB's episode rule (`early_stop`; 0 turns a rule off; WebRL's evaluation runs 5 and 5)."""
    self.extended_actions, self.compact, self.max_prompt_chars = extended_actions, compact, int(max_prompt_chars)
    self.stop_parse_failures, self.stop_repeats = int(stop_parse_failures), int(stop_repeats)
    self.supported_kinds = self._KINDS | ({ActionKind.WAIT} if extended_actions else frozenset())

  def build_prompt(self, task: Task | str, observation: Observation, history: Sequence[Step]) -> str:
    html = compact_html(observation.html) if self.compact else observation.html
    return webrl_prompt(base.task_intent(task), [s.action_text for s in history], html, self.max_prompt_chars)

  def observation_text(self, task, observation, history) -> str:
    return self.build_prompt(task, observation, history)

  def early_stop(self, steps: Sequence[Step]) -> str:
    return early_stop(steps, self.stop_parse_failures, self.stop_repeats)

  def _parse(self, text: str) -> Action:
    if text.endswith(EOT):  # the stop string, when a sampler keeps it (vLLM strips it)
      text = text[:-len(EOT)]
    try:
      return to_action(create_webrl_action(text, self.extended_actions), text.strip())
    except ActionParsingError as e:
      return Action.invalid(str(e))
    except (KeyError, AttributeError, TypeError) as e:  # the original raises these past its error handling
      return Action.invalid(f"{type(e).__name__}: {e} (parsing {text.strip()!r})")

  def render(self, action: Action, thought: str = "") -> str:
    if action.kind not in self.supported_kinds:
      raise self._unsupported(action)
    comment = "".join(f"# {line}\n" for line in thought.split("\n")) if thought else ""
    return comment + render_call(action, self.extended_actions)
