"""The scripted expert: executes a task's oracle through the real browser, in any agent format.

`ScriptedExpert(format_name)` is a `Policy`: given observations from a `SiteEnv(oracle_targets=True)` it emits
the exact text the original model of that format would emit for the oracle's next step: WebVoyager /
OpenWebVoyager replies with element ids from the set-of-marks or the accessibility tree, WebRL `do(...)` calls
with simplified-HTML ids, AutoUI decisions with normalised touch points. The oracle's selector is resolved to a
viewport box by the env (privileged, in `obs.extra`); the box is matched to the observer's elements by overlap
(the element text is the fallback). Off-screen or covered targets are scrolled to first.

`NoisyExpert` adds ε-random actions and early stops, so behaviour data has the mixed success offline RL needs;
its success rate falls with `epsilon` and `stop_prob` (measured rates in README.md).
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any, Sequence

from jaxagent import agents
from jaxagent.envs.sites.urls import shows
from jaxagent.types import Action, ActionKind, Element, Observation, Step

# The observation each format's element ids refer to (BrowserEnv's `observation` argument).
FORMAT_OBSERVATION = {"webvoyager": "som", "webvoyager_text": "a11y", "webvoyager_actree_image": "a11y",
                      "openwebvoyager": "a11y", "webrl": "html", "autoui": "som", "autoui_text": "html"}
# The phone's formats: a tap, then TYPE into the focused field, then PRESS_ENTER; no answer text. `autoui` taps at
# screen points, `autoui_text` names the simplified HTML's element.
PHONE_FORMATS = ("autoui", "autoui_text")
DONE_TEXT = "Done."
FINISHED = "The task is complete."  # the expert's thought before it answers
# Cleared before the oracle's next step: a perturbed episode's interstitial and its transient error page.
INTERRUPTS = ("#popup-close", "#retry")
DEAL = "#deal"  # the risky shortcut a perturbed episode may offer (the expert never takes it)


def intention(op: str, text: str) -> str:
  """The expert's thought before a click or a typing (`op`), `text` the element's text or the string typed."""
  return f"I will type \"{text}\" into the field." if op == "type" else f"I will click \"{text}\"."


def webrl_note(thought: str) -> str:
  """A thought as WebRL's comment line says it (`# Element:` / `# Note:`, §3.3); `WebRL.render` writes the `# `."""
  return f"Note: {thought}"


def target_selectors(oracle: Sequence[dict[str, Any]]) -> list[str]:
  """The selectors whose targets an env reports for the expert: the oracle's, the interrupts and the deal."""
  return sorted({s["selector"] for s in oracle if "selector" in s} | set(INTERRUPTS) | {DEAL})


_SESSION_PATH = re.compile(r"^https?://[^/]+/s/[^/]+(/.*)$")


def _site_relative(url: str) -> str:
  m = _SESSION_PATH.match(url or "")
  return m.group(1) if m else ""


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
  ax, ay, aw, ah = a
  bx, by, bw, bh = b
  w = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
  h = max(0.0, min(ay + ah, by + bh) - max(ay, by))
  inter = w * h
  union = aw * ah + bw * bh - inter
  return inter / union if union > 0 else 0.0


def _inside(point: tuple[float, float], bbox: Sequence[float]) -> bool:
  x, y, w, h = bbox
  return x <= point[0] <= x + w and y <= point[1] <= y + h


def match_element(elements: Sequence[Element], bbox: Sequence[float], text: str = "") -> Element | None:
  """The observed element that is the target: largest overlap among those centred in the target's box, else
  largest overlap above 0.3, else an element whose text is the step's text."""
  centred = [e for e in elements if _inside(e.center, bbox) and e.bbox[2] > 0 and e.bbox[3] > 0]
  if centred:
    return max(centred, key=lambda e: _iou(e.bbox, bbox))
  best = max(elements, key=lambda e: _iou(e.bbox, bbox), default=None)
  if best is not None and _iou(best.bbox, bbox) > 0.3:
    return best
  if text:
    for e in elements:
      if e.text.strip().lower() == text.strip().lower():
        return e
  return None


@dataclasses.dataclass
class _Progress:
  step: int = 0  # index into the oracle
  phase: int = 0  # sub-action within a step (AutoUI: tap, type, enter)
  last: tuple[int, int] | None = None  # the oracle position the last emitted action executed
  backs: int = 0  # recoveries (backs, rewinds) since the oracle last got further than ever before
  furthest: int = 0


class ScriptedExpert:
  """A `Policy` that follows the oracle in `obs.extra` (from `SiteEnv(oracle_targets=True)`)."""

  def __init__(self, format_name: str, max_recoveries: int = 3, **format_kwargs: Any):
    if format_name not in FORMAT_OBSERVATION:
      raise ValueError(f"format_name={format_name!r}: the expert speaks {sorted(FORMAT_OBSERVATION)}")
    self.format_name = format_name
    self.observation = FORMAT_OBSERVATION[format_name]
    self.fmt = agents.get_format(format_name, **format_kwargs)
    self.phone = format_name in PHONE_FORMATS
    self.max_recoveries = max_recoveries
    self._progress: dict[str, _Progress] = {}

  # --------------------------------------------------------------------------------------------- policy

  def act(self, observations: Sequence[Observation], histories: Sequence[list[Step]]) -> list[str]:
    return [self.act_one(obs, hist, k) for k, (obs, hist) in enumerate(zip(observations, histories))]

  def act_one(self, obs: Observation, history: Sequence[Step], slot: int = 0) -> str:
    action, thought = self.next_action(obs, history, slot)
    if self.phone:
      thought = ""  # AutoUI's "Action Plan" lists action types, not prose; render fills in the action's own
    elif self.format_name == "webrl":
      thought = webrl_note(thought)
    return self.fmt.render(action, thought)

  def next_action(self, obs: Observation, history: Sequence[Step], slot: int = 0) -> tuple[Action, str]:
    if "oracle" not in obs.extra:
      raise ValueError("the scripted expert needs SiteEnv(oracle_targets=True) observations (obs.extra['oracle'])")
    key = obs.extra.get("session") or f"slot{slot}"
    if not history or key not in self._progress:
      self._progress[key] = _Progress()
    prog = self._progress[key]
    if obs.error and prog.last is not None:  # the last oracle action failed: do it again
      prog.step, prog.phase = prog.last
    prog.last = None
    oracle, targets = obs.extra["oracle"], obs.extra.get("oracle_targets", {})
    for sel in INTERRUPTS:
      if targets.get(sel) is not None:
        interrupt = self._action(obs, {"op": "click", "selector": sel}, targets[sel], 0)
        if interrupt is not None:
          return interrupt, "Something is in the way; I will clear it first."
    here = _site_relative(obs.url)
    while prog.step < len(oracle):
      step = oracle[prog.step]
      op = step["op"]
      if step.get("done_if") and shows(step["done_if"], here):
        prog.step, prog.phase = prog.step + 1, 0
        continue
      if op == "home":
        prog.last = (prog.step, 0)
        prog.step, prog.phase = prog.step + 1, 0
        return Action(ActionKind.HOME), "I will go to the home screen."
      if op in ("answer", "stop"):
        prog.last = (prog.step, 0)
        return self._finish(step.get("text", DONE_TEXT) if op == "answer" else DONE_TEXT)
      target = targets.get(step["selector"])
      if target is None and step.get("optional"):
        prog.step, prog.phase = prog.step + 1, 0
        continue
      if target is None:
        if self._rewind(prog, oracle, targets):
          continue
        return self._recover(prog, f"I cannot find {step.get('text') or step['selector']} here; going back.")
      scroll = self._scroll_needed(obs, target)
      if scroll:
        return self._scroll(obs, scroll), f"The target is not visible; scrolling {scroll}."
      action = self._action(obs, step, target, prog.phase)
      if action is None:
        return self._recover(prog, f"I cannot locate {step.get('text') or step['selector']} on the page.")
      prog.last = (prog.step, prog.phase)
      if self.phone and op == "type" and prog.phase < (2 if step.get("enter") else 1):
        prog.phase += 1
      else:
        prog.step, prog.phase = prog.step + 1, 0
        if prog.step > prog.furthest:
          prog.furthest, prog.backs = prog.step, 0
      return action, self._thought(step)
    return self._finish(DONE_TEXT)

  # ------------------------------------------------------------------------------------------- helpers

  def _finish(self, text: str) -> tuple[Action, str]:
    return Action(ActionKind.ANSWER, text=text if not self.phone else ""), FINISHED

  def _rewind(self, prog: _Progress, oracle: list[dict[str, Any]], targets: dict[str, Any]) -> bool:
    """After a detour (a noisy action, a back too far) resume from the latest earlier oracle step whose target
    this page shows, e.g. the app icon on the launcher or the search box; counts as a recovery."""
    if prog.backs >= self.max_recoveries:
      return False
    for j in range(prog.step - 1, -1, -1):
      sel = oracle[j].get("selector")
      if sel and not oracle[j].get("optional") and targets.get(sel) is not None:
        prog.step, prog.phase, prog.backs = j, 0, prog.backs + 1
        return True
    return False

  def _recover(self, prog: _Progress, thought: str) -> tuple[Action, str]:
    prog.backs += 1
    if prog.backs > self.max_recoveries:
      return self._finish("I could not complete the task.")
    return Action(ActionKind.BACK), thought

  @staticmethod
  def _thought(step: dict[str, Any]) -> str:
    return intention(step["op"], step["text"] if step["op"] == "type" else step.get("text") or step["selector"])

  def _scroll_needed(self, obs: Observation, target: dict[str, Any]) -> str:
    if self.observation == "html":  # WebRL's ids cover the whole page; a click scrolls its element into view
      return ""
    _, height = obs.viewport
    x, y, w, h = target["bbox"]
    scroll_y, max_scroll_y = obs.extra.get("scroll", (0, 0))
    if y + h > height or target.get("covered"):  # not wholly on screen (the a11y tree keeps 80%+ visible nodes)
      return "down" if scroll_y < max_scroll_y else ""
    if y < 0:
      return "up"
    return ""

  def _scroll(self, obs: Observation, direction: str) -> Action:
    if self.phone:  # a finger swipe against the scroll direction
      y0, y1 = (0.75, 0.25) if direction == "down" else (0.25, 0.75)
      return Action(ActionKind.SWIPE, x=0.5, y=y0, x2=0.5, y2=y1, normalized=True)
    return Action(ActionKind.SCROLL, direction=direction)

  def _action(self, obs: Observation, step: dict[str, Any], target: dict[str, Any], phase: int) -> Action | None:
    op = step["op"]
    if self.phone and op == "type" and phase == 1:
      return Action(ActionKind.TYPE, text=step["text"])
    if self.phone and op == "type" and phase == 2:
      return Action(ActionKind.KEY, key="Enter")
    if self.format_name == "autoui":
      width, height = obs.viewport
      x, y, w, h = target["bbox"]
      return Action(ActionKind.CLICK, x=round((x + w / 2) / width, 4), y=round((y + h / 2) / height, 4),
                    normalized=True)
    if "element" in target:  # the text backend names the element (it has no boxes to match)
      element = next((e for e in obs.elements if e.index == target["element"]), None)
    else:
      element = match_element(obs.elements, target["bbox"], step.get("text", "") if op == "click" else "")
    if element is None:
      return None
    if op == "click" or self.phone:  # the phone's type step taps its field first (phase 0)
      return Action(ActionKind.CLICK, element=element.index)
    return Action(ActionKind.TYPE, element=element.index, text=step["text"], enter=bool(step.get("enter")))


class NoisyExpert(ScriptedExpert):
  """The expert with ε-random actions (a random element, scroll or back), early stops with a wrong answer, and
  (probability `shortcut`) the risky deal of a perturbed episode when it is on screen."""

  def __init__(self, format_name: str, epsilon: float = 0.2, stop_prob: float = 0.05, seed: int = 0,
               shortcut: float = 0.0, **kwargs: Any):
    super().__init__(format_name, **kwargs)
    if not (0 <= epsilon <= 1 and 0 <= stop_prob <= 1 and 0 <= shortcut <= 1):
      raise ValueError(f"epsilon={epsilon}, stop_prob={stop_prob} and shortcut={shortcut} must lie in [0, 1]")
    self.epsilon, self.stop_prob, self.shortcut = epsilon, stop_prob, shortcut
    self.rng = random.Random(seed)

  def next_action(self, obs: Observation, history: Sequence[Step], slot: int = 0) -> tuple[Action, str]:
    deal = obs.extra.get("oracle_targets", {}).get(DEAL)
    if self.shortcut and deal is not None and deal.get("in_view") and self.rng.random() < self.shortcut:
      action = self._action(obs, {"op": "click", "selector": DEAL, "text": "Deal"}, deal, 0)
      if action is not None:
        return action, "This deal looks like a shortcut."
    if history and self.rng.random() < self.stop_prob:
      return Action(ActionKind.ANSWER, text="I am not sure." if not self.phone else ""), \
          "I will stop here."
    if self.rng.random() < self.epsilon:
      key = obs.extra.get("session") or f"slot{slot}"
      if not history or key not in self._progress:
        self._progress[key] = _Progress()
      self._progress[key].last = None
      return self._random_action(obs), "Let me try something else."
    return super().next_action(obs, history, slot)

  def _random_action(self, obs: Observation) -> Action:
    r = self.rng.random()
    if r < 0.2:
      return self._scroll(obs, self.rng.choice(("down", "up")))
    if r < 0.3:
      return Action(ActionKind.BACK)
    if self.format_name == "autoui":
      return Action(ActionKind.CLICK, x=round(self.rng.random(), 4), y=round(self.rng.random(), 4), normalized=True)
    if not obs.elements:
      return self._scroll(obs, "down")
    return Action(ActionKind.CLICK, element=self.rng.choice(obs.elements).index)


def run_episode(env, policy, task, max_steps: int | None = None):
  """One episode of `policy` (texts, parsed by its format) in `env`; returns the `Trajectory`.

  A plain in-process loop for tests and measurements; training collects through `jaxagent.rl.collector`.
  """
  from jaxagent.types import Trajectory  # noqa: PLC0415

  fmt = policy.fmt
  obs = env.reset(task)
  traj = Trajectory(task=task, policy=type(policy).__name__)
  for k in range(max_steps or task.max_steps):
    text = policy.act([obs], [traj.steps])[0]
    action = fmt.parse(text)
    url = obs.url
    obs, reward, done, info = env.step(action)
    traj.steps.append(Step(step=k, action_text=text, action=action, reward=reward, done=done, url=url,
                           info={"next_url": obs.url, "error": info.get("error", "")}))
    if action.kind == ActionKind.ANSWER:
      traj.answer = action.text
    if done:
      break
  else:
    traj.status = "truncated"
  traj.meta["final_url"] = obs.url
  traj.meta.update({k: v for k, v in obs.extra.items() if k in ("session", "state_url")})
  return traj
