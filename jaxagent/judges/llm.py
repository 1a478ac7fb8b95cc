"""LLM judges over any OpenAI-compatible endpoint: WebVoyager's auto-evaluation and DigiRL's per-step judge.

Protocols (`reference/algorithms.md` §1.5, §4.5):
  * `webvoyager` (MinorJerry/WebVoyager:evaluation/auto_eval.py): system prompt; user message
    `TASK: <task>\\nResult Response: <answer>\\n<num> screenshots at the end: ` + the last k screenshots +
    `Your verdict:\\n`; temperature 0, seed 42, max_tokens 1000. 'NOT SUCCESS' in the reply -> 0,
    else 'SUCCESS' -> 1, else unjudged (OpenWebVoyager maps that to 0; we keep it visible). A trajectory
    whose last step is not an ANSWER scores 0 without a call, as the original. `<num>` is k itself, not
    the number of screenshots attached (the original's behaviour).
  * `digirl` (DigiRL-agent/digirl:digirl/environment/android/evaluate.py): after every step, the task and
    the new screenshot (downscaled 4x) -> `Status: success|failure`; the first success ends the episode
    with reward 1 (`step_rewards` gives the per-step rewards, `evaluate` the episode's verdict).
    Skipped without a call (reward 0) when the screen did not change (pixel MSE < 0.001·255²) or matches
    one of the first 5 judged screens (the original's cache of up to 5). The prompt is the original's
    few-shot one (`LLMJudgeConfig.digirl_task_set`): "general" (`build_prompt_general`, 9 exemplars) or
    "webshop" (`build_prompt_webshop`, 11 exemplars), each exemplar's Task/Q/A/Status text verbatim (typos
    included) with its screenshot, in the original's order, laid out as `call_gemini` lays out its parts:
    `<system>\\n=====Examples=====`, then per exemplar `\\nScreenshot:`, the image, the text; then
    `=====Your Turn=====`, `\\nScreenshot: `, the current screenshot, the final instruction. "zero_shot" is
    our earlier simplified prompt (system text, the "Your Turn" block and the current screenshot only).
    The exemplar screenshots are bundled in `jaxagent/judges/assets/digirl/` (Apache-2.0, see README.txt
    there) already downscaled 4x exactly as `process_image` downscales them at call time, so the model
    gets the same pixels. Departures: (1) an OpenAI-compatible chat model instead of Gemini-1.5-Pro: the
    Gemini content list becomes the parts of one user message, one part per Gemini part, in order (no
    system role, as the original has none); (2) the current screenshot is converted to RGB before the 4x
    downscale (the original keeps the file's mode, RGBA on Android, whose alpha is opaque); (3) the image
    cache is per trajectory (the original shares it across emulators, which DigiRL issue #25 reports as
    a bug); (4) a task_set other than the two is an error here (the original fails with UnboundLocalError);
    (5) a reply without `Status:` leaves the step unjudged (the original scores it 0, see Robustness).

Robustness: requests go through `jaxagent.openai_client` (retries with exponential backoff on 429, 5xx,
timeouts, connection errors, malformed bodies and blank replies; other 4xx fail at once; each attempt bounded by
`timeout_s` of wall-clock time and each request, retries included, by `deadline_s`; tokens and cost counted; keys
from `secrets.load_api_key`, every error text through `secrets.redact`), with its content-keyed on-disk cache
making re-judging free. Only a reply that holds a verdict is cached (WebVoyager: SUCCESS or NOT SUCCESS; DigiRL:
`Status:`), and a cache file that is not such an entry is a miss, so re-judging asks again whatever went wrong
before. A bounded thread pool judges many trajectories. A verdict that cannot be obtained is
`Verdict(None, reason)` (unjudged), never an exception from `evaluate` and never a silent 0: a DigiRL step whose
call failed or whose reply has no `Status:` is unjudged (departure (5): the original counts a reply without
`Status:` as failure), and so is an episode with such a step and no judged success.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import logging
import os
import re
from typing import Any, NamedTuple, Sequence

import numpy as np

from jaxagent import openai_client, secrets
from jaxagent.agents import base as fmt_base
from jaxagent.agents import webvoyager_prompts as P
from jaxagent.types import ActionKind, Task, Trajectory, Verdict

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LLMJudgeConfig:
  """Where and how to ask. No key in here: `api_key_env` / `api_key_file` say where to find it."""

  protocol: str = "webvoyager"  # "webvoyager" | "digirl"
  digirl_task_set: str = "general"  # DigiRL's few-shot prompt: "general" | "webshop" | "zero_shot"
  base_url: str = ""  # "" -> $OPENAI_BASE_URL or the OpenAI API
  model: str = "gpt-4o"
  api_key_env: str = "OPENAI_API_KEY"
  api_key_file: str = ""
  max_attached_imgs: int = 3  # k: 3 in OpenWebVoyager's exploration, 15 in WebVoyager's run_eval.sh
  max_tokens: int = 1000
  temperature: float = 0.0
  seed: int | None = 42
  timeout_s: float = 60.0  # wall-clock limit of one HTTP attempt (not per read: a trickling server is cut off)
  deadline_s: float = 0.0  # wall-clock limit of one request, retries and backoff included; 0 -> 4 × timeout_s
  max_retries: int = 6
  backoff_initial_s: float = 1.0
  backoff_max_s: float = 30.0
  concurrency: int = 8
  cache_dir: str = ""  # "" -> no cache
  image_root: str = ""  # where relative Step.image_path resolve (the trajectory store)
  usd_per_1k_prompt: float = 0.01  # WebVoyager's cost log
  usd_per_1k_completion: float = 0.03

  def __post_init__(self):
    if self.digirl_task_set not in DIGIRL_TASK_SETS:
      raise ValueError(f"LLMJudgeConfig.digirl_task_set {self.digirl_task_set!r} is unknown; allowed values: "
                       + ", ".join(repr(t) for t in DIGIRL_TASK_SETS))

  @classmethod
  def from_config(cls, cfg: Any) -> "LLMJudgeConfig":
    """From a dict or ml_collections ConfigDict; unknown keys are an error naming the valid ones."""
    return openai_client.config_from(cls, cfg, "LLM judge config")


class JudgeUnavailable(openai_client.CompletionUnavailable):
  """No usable reply could be obtained (the reason is already redacted)."""


@dataclasses.dataclass
class JudgeStats(openai_client.UsageStats):
  """The client's usage counts and the verdicts given."""

  verdicts: dict[str, int] = dataclasses.field(default_factory=dict)  # "success" | "failure" | "unjudged"


# ------------------------------------------------------------------------------------------ prompts


def webvoyager_messages(task: str, answer: str, images: Sequence[Any], img_num: int) -> list[fmt_base.Message]:
  user = (P.AUTO_EVAL_USER_PROMPT.replace("<task>", task).replace("<answer>", answer).replace("<num>", str(img_num)))
  content = [fmt_base.text_part(user)] + [fmt_base.image_part(i) for i in images]
  content.append(fmt_base.text_part(P.AUTO_EVAL_VERDICT_PROMPT))
  return [{"role": "system", "content": P.AUTO_EVAL_SYSTEM_PROMPT}, {"role": "user", "content": content}]


def _has_webvoyager_verdict(reply: str) -> bool:
  return "SUCCESS" in reply  # NOT SUCCESS included


def parse_webvoyager_verdict(reply: str) -> Verdict:
  if "NOT SUCCESS" in reply:
    return Verdict(0.0, "judge: NOT SUCCESS")
  if "SUCCESS" in reply:
    return Verdict(1.0, "judge: SUCCESS")
  return Verdict(None, f"judge reply has neither SUCCESS nor NOT SUCCESS: {reply[-200:]!r}")


DIGIRL_SYSTEM = "You're an expert in evaluating whether the Screenshot successfully completes the Task."
DIGIRL_YOUR_TURN = ("Task: {intent}\nRespond in this format:\nQ: What should I expect to see on the screenshot if "
                    "I've <repeat the task>?\nA: I should expect to see <first expectation, then what's in the given "
                    "screenshot.>\nStatus: success or failure (don't return anything else)\nStart with \"Q:\".")


DIGIRL_ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "digirl")


class DigiRLExemplar(NamedTuple):
  """One few-shot exemplar of DigiRL's evaluator: its screenshot (a file in `DIGIRL_ASSETS`) and its text."""

  image: str
  task: str
  q: str
  a: str
  status: str

  @property
  def text(self) -> str:
    return f"Task: {self.task}\nQ: {self.q}\nA: {self.a}\nStatus: {self.status}"

  @property
  def image_path(self) -> str:
    return os.path.join(DIGIRL_ASSETS, self.image)


# evaluate.py's `build_prompt_general` / `build_prompt_webshop` (commit c74ec34), verbatim and in order; the
# `# #i` comments are the original's indices into its prompt and `cot_image_list`.
DIGIRL_GENERAL_EXEMPLARS = (
    DigiRLExemplar("screenshot_menu.png",  # #0
                   "Open the settings.",
                   "What should I expect to see on the screenshot if I've opened the settings?",
                   "I should expect to see I'm in the settings app. The screenshot shows the home screen of a mobile "
                   "device, with various app icons displayed, including the settings app icon, but the settings app "
                   "is not opened.",
                   "failure"),
    DigiRLExemplar("screenshot_hotel.png",  # #1
                   "Find hotels in washington dc",
                   "What should I expect to see on the screenshot if I've searched for hotels in Washington, DC?",
                   "I should expect to see I'm in a search results page for hotels in Washington, DC. The screenshot "
                   'shows a Google search page with the search field populated with the query "hotels in washington '
                   'dc" and a list of suggested searches related to hotels in Washington, DC, but it does not show '
                   "any search results for hotels in Washington, DC.",
                   "failure"),
    DigiRLExemplar("screenshot_restaurant.png",  # #2
                   "What's a good restaurant in Portland?",
                   "What should I expect to see on the screenshot if I've searched for a good restaurant in "
                   "Portland?",
                   "I should expect to see I'm in a search results page for a good restaurant in Portland. The "
                   'screenshot shows a Google search page with a search input field for "good restaurant in '
                   'portland" and a map results preview showing business locations near Portland, like "Li Pigeon", '
                   '"Portland City Grill", and "Higgins",',
                   "success"),
    DigiRLExemplar("screenshot_foodmenu.png",  # #3
                   "What's on the menu at In-N-Out?",
                   "What should I expect to see on the screenshot if I've searched for the menu at In-N-Out?",
                   "I should expect to see a menu page for In-N-Out, including product names, thumbnails and prices. "
                   'The screenshot shows a Google search page with a search input field for "In-N-Out menu" and some '
                   "page snippets of In-N-Out indicating potential menu items, but does not actually show the actual "
                   "menu.",
                   "failure"),
    DigiRLExemplar("screenshot_news.png",  # #4
                   "What's the news in Suriname?",
                   "What should I expect to see on the screenshot if I've searched for the news in Suriname?",
                   "I should expect to see some news in Suriname, such as someone did something or some accident "
                   "happens in Suriname. The screenshot shows a Google search page with a search input field for "
                   '"Suriname news today" and some page snippets indicating potential news items, but does not '
                   "actually show the news.",
                   "failure"),
    DigiRLExemplar("screenshot_weather.png",  # #5
                   "What's the weather like in Chicago?",
                   "What should I expect to see on the screenshot if I've searched for the weather in Chicago?",
                   "I should expect to see some exact values like temperature, humidity, wind speed, and weather "
                   "condition in Chicago. The screenshot shows a Google search page with a search input field for "
                   '"weather in Chicago" and some page snippets indicating potential weather information. Although '
                   "one page snippet contains some weather information, the information is not comprehensive enough "
                   "to determine the weather in Chicago.",
                   "failure"),
    DigiRLExemplar("screenshot_alarm.png",  # #6
                   "Set an alarm for 6pm.",
                   "What should I expect to see on the screenshot if I've set an alarm for 6pm?",
                   "I should expect to see some alarms including a 6pm alarm activated in the clock app. The "
                   "screenshot shows an attempt to set an alarm for 6pm in the clock app, but the alarm is not set "
                   "yet.",
                   "failure"),
    DigiRLExemplar("screenshot_frenchnews_blocked.png",  # #7
                   "What's the news in French today?",
                   "What should I expect to see on the screenshot if I've searched for the news in French today?",
                   "I should expect to see some news in French today, such as someone did something or some accident "
                   "happens in French today. The screenshot shows I'm in the website france24.com but blocked with a "
                   "cookie consent banner.",
                   "failure"),
    DigiRLExemplar("screenshot_frenchnews_okay.png",  # #8
                   "What's the news in French today?",
                   "What should I expect to see on the screenshot if I've searched for the news in French today?",
                   "I should expect to see some news in French today, such as someone did something or some accident "
                   "happens in French today. The screenshot shows I'm in the website france24.com and can see the "
                   "news, like something about the Olympic flame.",
                   "success"),
)

DIGIRL_WEBSHOP_EXEMPLARS = (
    DigiRLExemplar("step1_bestbuy.png",  # #0
                   "Go to bestbuy.com",
                   "What should I expect to see on the screenshot if I've gone to bestbuy.com?",
                   "I should expect to see I'm in the Best Buy website, which usually shows the best buy logo with "
                   "some featured products and categories. The screenshot shows I'm searching for \"bestbuy.com\" in "
                   "the Google search (with some search suggestions) instead of being in the Best Buy website.",
                   "failure"),
    DigiRLExemplar("step1_costco.png",  # #1
                   "Go to costco.com",
                   "What should I expect to see on the screenshot if I've gone to costco.com?",
                   "I should expect to see I'm in the Costco website, which usually shows the homepage with some "
                   "featured products and categories. The screenshot shows I'm in the Costco website with some "
                   "featured products and categories.",
                   "success"),
    DigiRLExemplar("step2_bestbuy.png",  # #2
                   'Go to bestbuy.com, search for "macbook"',
                   "What should I expect to see on the screenshot if I've gone to bestbuy.com AND searched for "
                   '"macbook"?',
                   "I should expect to see I'm in the Best Buy website and search results for \"macbook\". The "
                   "screenshot shows I'm in the Best Buy website and have several search suggestions for \"macbook\", "
                   "but it does not show search results of the product, which usually includes price and the product "
                   "details.",
                   "failure"),
    DigiRLExemplar("step2_ebay.png",  # #3
                   'Go to ebay.com, search for "corsair k70"',
                   "What should I expect to see on the screenshot if I've gone to ebay.com AND searched for \"corsair "
                   'k70"?',
                   "I should expect to see I'm in the eBay website and search results for \"corsair k70\". The "
                   "screenshot shows I'm in the eBay ebay website with some search suggestions for \"corsair k70\", "
                   "but it does not show search results of the product, which usually includes price and the product "
                   "details.",
                   "failure"),
    DigiRLExemplar("step2_walmart.png",  # #4
                   'Go to walmart.com, search for "macbook air"',
                   "What should I expect to see on the screenshot if I've gone to walmart.com AND searched for "
                   '"macbook air"?',
                   "I should expect to see I'm in the Walmart website and search results for \"razer huntsman\". The "
                   "screenshot shows I'm in Google search with some search suggestions for \"macbook air\", not "
                   "Walmart.",
                   "failure"),
    DigiRLExemplar("step2_walmart2.png",  # #5
                   'Go to walmart.com, search for "razer huntsman"',
                   "What should I expect to see on the screenshot if I've gone to walmart.com AND searched for "
                   '"razer huntsman"?',
                   "I should expect to see I'm in the Walmart website and search results for \"razer huntsman\". The "
                   "screenshot shows I'm in the Walmart website, but there's no search results for \"razer huntsman\", "
                   "which usually includes the product details and price.",
                   "failure"),
    DigiRLExemplar("step2_ebay2.png",  # #6
                   'Go to ebay.com, search for "lenovo thinkpad"',
                   "What should I expect to see on the screenshot if I've gone to ebay.com AND searched for \"lenovo "
                   'thinkpad"?',
                   "I should expect to see I'm in the eBay website and search results for \"lenovo thinkpad\". The "
                   "screenshot shows I'm in the eBay website and have several search results for \"lenovo thinkpad\".",
                   "success"),
    DigiRLExemplar("step3_ebay.png",  # #7
                   'Go to ebay.com, search for "razer thresher", select the first entry',
                   "What should I expect to see on the screenshot if I've gone to ebay.com AND going to the first "
                   'entry of the search results of "razer thresher"?',
                   "I should expect to see I'm in the eBay website and detailed information of a razer thresher "
                   "product, like a big image of the product, the price, and the product details. The screenshot "
                   "shows I'm in the eBay website but with more than one search results for \"razer thresher\", which "
                   "means the user has not selected the first entry of the search results.",
                   "failure"),
    DigiRLExemplar("step3_target.png",  # #8
                   'Go to target.com, search for "razer kraken", and select the first entry',
                   "What should I expect to see on the screenshot if I've gone to target.com AND gone to the first "
                   'entry of the search results of "razer kraken"?',
                   "I should expect to see I'm in the Target website and can see detailed information of a razer "
                   "thresher product, like a big image of the product, the price, and the product details. The "
                   "screenshot shows I'm in Google Search, not in the Target website.",
                   "failure"),
    DigiRLExemplar("step3_ebay2.png",  # #9
                   'Go to ebay.com, search for "acer predator", and select the first entry',
                   "What should I expect to see on the screenshot if I've gone to ebay.com AND gone to the first "
                   'entry of the search results of "acer predator"?',
                   "I should expect to see I'm in the eBay website with detailed information of an acer predator "
                   "product, like a big image of the product, the price, and the product details. The screenshot "
                   "shows I'm in the eBay website and have more than one search results for \"acer predator\", which "
                   "means the user has not selected the first entry of the search results.",
                   "failure"),
    DigiRLExemplar("step3_bestbuy.png",  # #10
                   'Go to bestbuy.com, search for "macbook", select the first entry',
                   "What should I expect to see on the screenshot if I've gone to bestbuy.com AND gone to the first "
                   'entry of the search results of "macbook"?',
                   "I should expect to see I'm in the eBay website and detailed information of a macbook product, "
                   "like a big image of the product, the price, and the product details. The screenshot shows I'm in "
                   "the eBay website and have detailed information of Macbook Air, including the price and the "
                   "product details.",
                   "success"),
)

DIGIRL_EXEMPLARS = {"general": DIGIRL_GENERAL_EXEMPLARS, "webshop": DIGIRL_WEBSHOP_EXEMPLARS}
DIGIRL_TASK_SETS = ("general", "webshop", "zero_shot")


def digirl_messages(intent: str, image: Any, task_set: str = "general") -> list[fmt_base.Message]:
  """DigiRL's evaluator prompt for `task_set` ("general" | "webshop": the few-shot prompts; "zero_shot": the
  simplified one), as one OpenAI user message whose parts are `call_gemini`'s, in order (module docstring)."""
  your_turn = fmt_base.text_part(DIGIRL_YOUR_TURN.format(intent=intent))
  if task_set == "zero_shot":
    return [{"role": "user", "content": [
        fmt_base.text_part(DIGIRL_SYSTEM + "\n" + "=====Your Turn=====" + "\nScreenshot: "),
        fmt_base.image_part(image),
        your_turn]}]
  if task_set not in DIGIRL_EXEMPLARS:
    raise ValueError(f"DigiRL task_set {task_set!r} is unknown; allowed values: "
                     + ", ".join(repr(t) for t in DIGIRL_TASK_SETS))
  content = [fmt_base.text_part(DIGIRL_SYSTEM + "\n" + "=====Examples=====")]
  for ex in DIGIRL_EXEMPLARS[task_set]:
    content += [fmt_base.text_part("\nScreenshot:"), fmt_base.image_part(ex.image_path), fmt_base.text_part(ex.text)]
  content += [fmt_base.text_part("=====Your Turn====="), fmt_base.text_part("\nScreenshot: "),
              fmt_base.image_part(image), your_turn]
  return [{"role": "user", "content": content}]


_DIGIRL_STATUS = re.compile(r"Status:\s*(\w+)")


def _has_digirl_status(reply: str) -> bool:
  return _DIGIRL_STATUS.search(reply) is not None


def parse_digirl_status(reply: str) -> Verdict:
  """The original's reading: no `Status:` is a failure (the judge itself leaves such a step unjudged)."""
  match = _DIGIRL_STATUS.search(reply)
  if match is None:
    return Verdict(0.0, "judge reply has no 'Status:' (DigiRL counts this as failure)")
  status = match.group(1)
  return Verdict(1.0 if "success" in status.lower() else 0.0, f"judge: Status: {status}")


# ---------------------------------------------------------------------------------------- the judge


def _image_array(image: Any, image_root: str) -> np.ndarray:
  from PIL import Image  # pylint: disable=g-import-not-at-top

  if isinstance(image, np.ndarray):
    return image
  path = image if not image_root or os.path.isabs(image) else os.path.join(image_root, image)
  with Image.open(path) as im:
    return np.asarray(im.convert("RGB"))


def _screens(trajectory: Trajectory, t: int) -> tuple[Any, Any]:
  """Step t's screen before and after (a stored path, or the in-memory screenshot), None where missing."""
  steps = trajectory.steps

  def shot(obs):
    return obs.screenshot if obs is not None and obs.screenshot is not None else None

  before = steps[t].image_path or shot(steps[t].observation)
  after = steps[t].next_image_path or (shot(steps[t + 1].observation) if t + 1 < len(steps)
                                       else shot(trajectory.final_observation))
  return before, after


def _quarter(image: np.ndarray) -> bytes:
  """DigiRL's `process_image`: resize to 1/4 width and height, as PNG."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  im = Image.fromarray(image)
  im = im.resize((max(1, im.width // 4), max(1, im.height // 4)))
  buf = io.BytesIO()
  im.save(buf, format="PNG")
  return buf.getvalue()


def _final_answer(trajectory: Trajectory) -> str | None:
  """The answer of an episode that ended with ANSWER, else None (WebVoyager then scores 0)."""
  last = trajectory.steps[-1] if trajectory.steps else None
  if last is not None and last.action is not None and last.action.kind == ActionKind.ANSWER:
    return last.action.text.strip()
  if trajectory.answer:
    return trajectory.answer.strip()
  return None


class LLMJudge:
  """A `Judge` that asks an OpenAI-compatible model; see the module docstring for the protocols."""

  def __init__(self, config: LLMJudgeConfig | dict | Any = None, client: Any = None):
    self.config = config if isinstance(config, LLMJudgeConfig) else LLMJudgeConfig.from_config(config or {})
    if self.config.protocol not in ("webvoyager", "digirl"):
      raise ValueError(f"LLM judge protocol {self.config.protocol!r} is unknown; use 'webvoyager' or 'digirl'")
    self.stats = JudgeStats()
    self._api = openai_client.OpenAIClient(openai_client.ClientConfig.like(self.config), client=client,
                                           stats=self.stats, owner="judge")

  def client(self):
    """The `openai.OpenAI` client, built (and its key looked up) on first use."""
    return self._api.client()

  def complete(self, messages: list[fmt_base.Message], keep=None) -> str:
    """The model's reply text; raises `JudgeUnavailable` (redacted reason) when none can be had. `keep(reply)`:
    whether the reply may be cached (`OpenAIClient.complete`); the protocols keep only replies with a verdict."""
    try:
      return self._api.complete(messages, keep=keep)
    except openai_client.CompletionUnavailable as e:
      raise JudgeUnavailable(str(e)) from None

  # ---- protocols
  def evaluate(self, task: Task, trajectory: Trajectory) -> Verdict:
    try:
      if self.config.protocol == "webvoyager":
        verdict = self._webvoyager(task, trajectory)
      else:
        verdict = self._digirl(task, trajectory)
    except openai_client.CompletionUnavailable as e:
      verdict = Verdict(None, f"unjudged: {e}")
    except (OSError, ValueError) as e:  # unreadable screenshots and the like: unjudged, with the reason
      verdict = Verdict(None, secrets.redact(f"unjudged: {type(e).__name__}: {e}"))
    except Exception as e:  # pylint: disable=broad-except
      # Anything else is a bug here, but one trajectory must not end the collection of all the others.
      log.exception("LLM judge: evaluating %s raised; left unjudged", task.id)
      verdict = Verdict(None, secrets.redact(f"unjudged: {type(e).__name__}: {e}"))
    key = "unjudged" if verdict.success is None else ("success" if verdict.success >= 1.0 else "failure")
    self._api.count("verdicts", key)
    return verdict

  def _root(self, trajectory: Trajectory) -> str:
    return trajectory.meta.get("image_root") or self.config.image_root

  def _webvoyager(self, task: Task, trajectory: Trajectory) -> Verdict:
    answer = _final_answer(trajectory)
    if answer is None:
      return Verdict(0.0, "no ANSWER at the end of the trajectory (WebVoyager's auto_eval scores 0 without asking)")
    k = self.config.max_attached_imgs
    root = self._root(trajectory)
    paths = [s.image_path for s in trajectory.steps if s.image_path][-k:]
    images = [p if os.path.isabs(p) or not root else os.path.join(root, p) for p in paths]
    reply = self.complete(webvoyager_messages(task.intent, answer, images, k), keep=_has_webvoyager_verdict)
    return parse_webvoyager_verdict(reply)

  def step_rewards(self, task: Task, trajectory: Trajectory) -> list[Verdict]:
    """DigiRL's per-step rewards: one verdict per step up to the first success (which ends the episode).

    A step the judge could not be asked about, or whose reply has no `Status:`, is `Verdict(None, reason)`
    (unjudged, never a guessed 0; its reply is not cached, so judging again asks again); later steps are still
    judged. A 0.0 is either the judge's failure status or a skipped screen (unchanged or seen before).
    The screens are the stored ones (`Step.image_path` / `next_image_path`) or, for an episode the collector is
    judging before it is stored, the in-memory observations. Raises ValueError naming the field when a step
    has neither.
    """
    threshold = 0.001 * 255 ** 2
    seen: list[np.ndarray] = []
    root = self._root(trajectory)
    out: list[Verdict] = []
    for t, step in enumerate(trajectory.steps):
      before, after = _screens(trajectory, t)
      if before is None or after is None:
        raise ValueError(f"step {t} lacks Step.image_path / Step.next_image_path (DigiRL judges each new screen)")
      prev = _image_array(before, root).astype(np.float64)
      cur_u8 = _image_array(after, root)
      cur = cur_u8.astype(np.float64)
      if prev.shape == cur.shape and np.mean((prev - cur) ** 2) < threshold:
        out.append(Verdict(0.0, f"step {t}: screen unchanged"))
        continue
      if any(s.shape == cur.shape and np.mean((s - cur) ** 2) < threshold for s in seen):
        out.append(Verdict(0.0, f"step {t}: screen seen before"))
        continue
      try:
        messages = digirl_messages(task.intent, _quarter(cur_u8), self.config.digirl_task_set)
        reply = self.complete(messages, keep=_has_digirl_status)
        verdict = parse_digirl_status(reply) if _has_digirl_status(reply) else Verdict(
            None, f"unjudged: judge reply has no 'Status:' (the original counts this as failure): {reply[-200:]!r}")
      except JudgeUnavailable as e:
        verdict = Verdict(None, f"unjudged: {e}")
      if verdict.success is not None and len(seen) < 5:  # an unjudged screen seen again is asked about again
        seen.append(cur)
      out.append(Verdict(verdict.success, f"step {t}: {verdict.reason}"))
      if verdict.success == 1.0:
        break
    return out

  def _digirl(self, task: Task, trajectory: Trajectory) -> Verdict:
    steps = self.step_rewards(task, trajectory)
    reason = "; ".join(v.reason for v in steps) or "no steps"
    if any(v.success == 1.0 for v in steps):
      return Verdict(1.0, steps[-1].reason)
    if any(v.success is None for v in steps):
      return Verdict(None, reason)
    return Verdict(0.0, reason)

  def evaluate_many(self, pairs: Sequence[tuple[Task, Trajectory]]) -> list[Verdict]:
    """Judge many trajectories on a bounded thread pool; the order of the result follows `pairs`."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.config.concurrency)) as pool:
      return list(pool.map(lambda p: self.evaluate(*p), pairs))
