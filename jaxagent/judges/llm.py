"""LLM judges over any OpenAI-compatible endpoint: `LLMJudge` asks a chat model whether a trajectory did its task,
by one of the originals' protocols (`reference/algorithms.md` §1.5, §4.5), each in its own module:
  * `webvoyager` (`judges.webvoyager`): WebVoyager's auto-evaluation of the answer and the last screenshots,
    OpenWebVoyager's judge;
  * `digirl` (`judges.digirl`, prompts in `judges.digirl_prompts`): DigiRL's per-step evaluator of each new screen.
Their prompts and parsers are importable from here as well.

Robustness: requests go through `jaxagent.openai_client` (retries with exponential backoff on 429, 5xx,
timeouts, connection errors, malformed bodies and blank replies; other 4xx fail at once; each attempt bounded by
`timeout_s` of wall-clock time and each request, retries included, by `deadline_s`; tokens and cost counted; keys
from `secrets.load_api_key`, every error text through `secrets.redact`), with its content-keyed on-disk cache
making re-judging free. Only a reply that holds a verdict is cached (WebVoyager: SUCCESS or NOT SUCCESS; DigiRL:
`Status:`), and a cache file that is not such an entry is a miss, so re-judging asks again whatever went wrong
before. A bounded thread pool judges many trajectories. A verdict that cannot be obtained is
`Verdict(None, reason)` (unjudged), never an exception from `evaluate` and never a silent 0: a DigiRL step whose
call failed or whose reply has no `Status:` is unjudged (the original counts a reply without `Status:` as
failure), and so is an episode with such a step and no judged success.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Any, Sequence

from jaxagent import openai_client, secrets
from jaxagent.agents import base as fmt_base
from jaxagent.judges import digirl, webvoyager
from jaxagent.judges.digirl import digirl_messages, parse_digirl_status
from jaxagent.judges.digirl_prompts import (
    DIGIRL_ASSETS, DIGIRL_EXEMPLARS, DIGIRL_GENERAL_EXEMPLARS, DIGIRL_SYSTEM, DIGIRL_TASK_SETS,
    DIGIRL_WEBSHOP_EXEMPLARS, DIGIRL_YOUR_TURN, DigiRLExemplar)
from jaxagent.judges.webvoyager import parse_webvoyager_verdict, webvoyager_messages
from jaxagent.types import Task, Trajectory, Verdict

__all__ = [  # the judge, and the protocols' prompts and parsers (importable from here too)
    "JudgeStats", "JudgeUnavailable", "LLMJudge", "LLMJudgeConfig", "PROTOCOLS", "DIGIRL_ASSETS", "DIGIRL_EXEMPLARS",
    "DIGIRL_GENERAL_EXEMPLARS", "DIGIRL_SYSTEM", "DIGIRL_TASK_SETS", "DIGIRL_WEBSHOP_EXEMPLARS", "DIGIRL_YOUR_TURN",
    "DigiRLExemplar", "digirl_messages", "parse_digirl_status", "parse_webvoyager_verdict", "webvoyager_messages"]

log = logging.getLogger(__name__)

PROTOCOLS = ("webvoyager", "digirl")


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
    openai_client.check_settings(type(self), vars(self), type(self).__name__)
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


class LLMJudge:
  """A `Judge` that asks an OpenAI-compatible model by `config.protocol` (module docstring)."""

  def __init__(self, config: LLMJudgeConfig | dict | Any = None, client: Any = None):
    self.config = config if isinstance(config, LLMJudgeConfig) else LLMJudgeConfig.from_config(config or {})
    if self.config.protocol not in PROTOCOLS:
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

  def evaluate(self, task: Task, trajectory: Trajectory) -> Verdict:
    """The protocol's verdict; whatever goes wrong leaves it unjudged with the (redacted) reason."""
    try:
      verdict = self._judge(task, trajectory)
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

  def _judge(self, task: Task, trajectory: Trajectory) -> Verdict:
    if self.config.protocol == "webvoyager":
      return webvoyager.judge(self.complete, task, trajectory, self.config.max_attached_imgs, self._root(trajectory))
    return digirl.episode_verdict(self.step_rewards(task, trajectory))

  def _root(self, trajectory: Trajectory) -> str:
    """Where the trajectory's relative screenshot paths resolve: its own store, else the configured one."""
    return trajectory.meta.get("image_root") or self.config.image_root

  def step_rewards(self, task: Task, trajectory: Trajectory) -> list[Verdict]:
    """DigiRL's per-step rewards (`digirl.step_rewards`): one verdict per step up to the first success."""
    return digirl.step_rewards(self.complete, task, trajectory, self.config.digirl_task_set, self._root(trajectory))

  def evaluate_many(self, pairs: Sequence[tuple[Task, Trajectory]]) -> list[Verdict]:
    """Judge many trajectories on a bounded thread pool; the order of the result follows `pairs`."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.config.concurrency)) as pool:
      return list(pool.map(lambda p: self.evaluate(*p), pairs))
