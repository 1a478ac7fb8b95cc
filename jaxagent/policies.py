"""Acting through any OpenAI-compatible endpoint (`OpenAIPolicy`); a local model acts through
`pipeline.policy.ModelPolicy`, and `make_policy` builds either from a config.

Both implement `types.Policy`: a batch of observations with each episode's history -> one model text per
row, which the rollout collector parses with the same agent format. The prompt is the agent format's
(`agents.get_format(name).build_prompt`), so the model sees exactly what the format's original saw.

`OpenAIPolicy` is OpenWebVoyager's data collector: GPT-4o (or any OpenAI-compatible model, including
`python -m jaxagent.serve`) driving the WebVoyager prompt with history clipped to the last 3 screenshots
(`webvoyager.clip_message_and_obs`), `max_tokens=1000`, `seed=42`, the API's default temperature 1
(WebVoyager's `run.py` parses `--temperature` but never sends it, `reference/algorithms.md` §1.4).
Requests go through `openai_client.OpenAIClient`, as the LLM judges' do: retries with backoff on 429/5xx/timeouts,
token and cost accounting, keys from `secrets` only (never in the config), redacted errors.

History images: during a rollout the collector keeps each step's screenshot on `Step.observation`, not
on disk (`Step.image_path` is set when a store writes it); both are used, so earlier turns keep their
screenshots until clipping drops them, as in the original.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Any, Sequence

from jaxagent import openai_client
from jaxagent.agents import get_format
from jaxagent.agents.base import AgentFormat, history_with_images
from jaxagent.types import Observation, Step

log = logging.getLogger(__name__)


def build_prompts(fmt: AgentFormat, observations: Sequence[Observation], histories: Sequence[list[Step]]):
  """The agent format's prompt for each row (the task is the observation's intent, its URL the start page)."""
  if len(observations) != len(histories):
    raise ValueError(f"act: {len(observations)} observations but {len(histories)} histories")
  return [fmt.build_prompt(obs.intent, obs, history_with_images(hist))
          for obs, hist in zip(observations, histories)]


def _format(agent_format: str | AgentFormat, **kwargs) -> AgentFormat:
  return agent_format if isinstance(agent_format, AgentFormat) else get_format(agent_format, **kwargs)


# ------------------------------------------------------------------------------- OpenAI-compatible


@dataclasses.dataclass
class OpenAIPolicyConfig:
  """Where the acting model lives. No key here: `api_key_env` / `api_key_file` say where to find it."""

  base_url: str = ""  # "" -> $OPENAI_BASE_URL or the OpenAI API
  model: str = "gpt-4o"
  agent_format: str = "webvoyager_actree_image"  # OpenWebVoyager's GPT-4o teacher; "webvoyager" for SoM
  max_attached_imgs: int = 3
  api_key_env: str = "OPENAI_API_KEY"
  api_key_file: str = ""
  max_tokens: int = 1000
  temperature: float = 1.0  # the API default WebVoyager ran at
  seed: int | None = 42
  timeout_s: float = 120.0
  max_retries: int = 6
  concurrency: int = 8  # rows asked in parallel

  def __post_init__(self):
    openai_client.check_settings(type(self), vars(self), type(self).__name__)

  @classmethod
  def from_config(cls, cfg: Any) -> "OpenAIPolicyConfig":
    return openai_client.config_from(cls, cfg, "OpenAI policy config")


class OpenAIPolicy:
  """Any OpenAI-compatible chat model as the acting agent (see the module docstring).

  A row whose request fails after all retries gets the empty text, which the format parses as its Format
  ERROR (the episode goes on, with the feedback in the next observation); the failure is counted in
  `stats.failures` and logged, redacted.
  """

  def __init__(self, config: OpenAIPolicyConfig | dict | Any = None, client: Any = None):
    self.config = config if isinstance(config, OpenAIPolicyConfig) else OpenAIPolicyConfig.from_config(config or {})
    c = self.config
    try:
      self.fmt = _format(c.agent_format, max_attached_imgs=c.max_attached_imgs)
    except TypeError:
      raise ValueError(f"OpenAIPolicy needs a chat agent format that clips screenshot history (e.g. "
                       f"'webvoyager_actree_image', 'webvoyager'); {c.agent_format!r} takes no max_attached_imgs"
                       ) from None
    self._completer = openai_client.OpenAIClient(openai_client.ClientConfig.like(c), client=client, owner="policy")

  @property
  def stats(self) -> openai_client.UsageStats:
    """Requests, retries by cause, failures, tokens and cost."""
    return self._completer.stats

  def _one(self, messages) -> str:
    try:
      return self._completer.complete(messages)
    except openai_client.CompletionUnavailable as e:
      log.warning("OpenAIPolicy: no reply (%s); the row acts on an empty text", e)
      return ""

  def act(self, observations: Sequence[Observation], histories: Sequence[list[Step]]) -> list[str]:
    prompts = build_prompts(self.fmt, observations, histories)
    for p in prompts:
      if isinstance(p, str):
        raise ValueError(f"OpenAIPolicy needs a chat agent format; {self.fmt.name!r} builds completion prompts")
    if len(prompts) == 1:
      return [self._one(prompts[0])]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(self.config.concurrency, len(prompts)))) as ex:
      return list(ex.map(self._one, prompts))


def make_policy(config: Any):
  """`{"kind": "model", "checkpoint": DIR, "temperature": ..., ["agent_format": NAME]}` (a trained actor, acting as
  its `agent.json` says unless a format is named) or `{"kind": "openai", ...}`."""
  d = dict(config.to_dict() if hasattr(config, "to_dict") else config)
  kind = d.pop("kind", "model")
  if kind == "openai":
    return OpenAIPolicy(OpenAIPolicyConfig.from_config(d))
  if kind == "model":
    if "checkpoint" not in d:
      raise ValueError("a model policy config needs 'checkpoint' (a trained actor's directory)")
    from jaxagent.pipeline import policy  # pylint: disable=g-import-not-at-top  # JAX only for a local model
    return policy.load(d.pop("checkpoint"), fmt=d.pop("agent_format", None), temperature=d.pop("temperature", 1.0),
                       **d)
  raise ValueError(f"policy kind {kind!r} is unknown; use 'model' or 'openai'")
