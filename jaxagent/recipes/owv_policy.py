"""The trained VLM as OpenWebVoyager's acting policy, prompted exactly as it was trained.

`policies.ModelPolicy` renders chat messages through the tokenizer's chat template, which puts a space after
every image part; the IL data is rendered by `data.conversation.render`, which does not. A small model is
sensitive to that skew, so this policy renders the same compressed conversation (`fmt.conversation`) with the
training renderer itself and hands the engine a string prompt plus the screenshots its `<image>` markers name
(the last ≤3, §2.2). All rows of one `act` call are one engine call (batched into one sampler call).
"""

from __future__ import annotations

import collections
from typing import Sequence

from jaxagent import types
from jaxagent.data import conversation
from jaxagent.data.tokenizer import IMAGE_TOKEN


class OWVModelPolicy:
  """`types.Policy` over a `serving.checkpoint.LoadedPolicy`; `fmt` is the OWV format the data was built with.

  A row whose prompt exceeds the model's context gets the empty reply (the format's Format ERROR, as a
  server's 400 would give the original agent) and is counted in `stats["too_long"]`.
  """

  def __init__(self, loaded, fmt, *, temperature: float, max_tokens: int = 64, max_batch: int = 16, seed: int = 0):
    from jaxagent.serving.engine import Engine  # pylint: disable=g-import-not-at-top
    self.engine = Engine(loaded, max_batch=max_batch, max_new_tokens=max_tokens, seed=seed)
    self.bos = loaded.tokenizer.bos_token or ""
    self.fmt = fmt
    self.temperature, self.max_tokens = float(temperature), int(max_tokens)
    self.stats = collections.Counter()

  def prompt(self, observation: types.Observation, history: Sequence[types.Step]) -> tuple[str, list]:
    """(rendered text up to `Assistant:`, the screenshots of its `<image>` markers in order)."""
    conv = self.fmt.conversation(observation.intent, observation, history)
    text = conversation.render(conv, self.bos)[0] + "Assistant:"
    shots = [s.observation.screenshot if s.observation is not None and s.observation.screenshot is not None
             else s.image_path for s in history] + [observation.screenshot]
    n = text.count(IMAGE_TOKEN)
    return text, shots[len(shots) - n:] if n else []

  def act(self, observations: Sequence[types.Observation], histories: Sequence[list[types.Step]]) -> list[str]:
    from jaxagent.serving.engine import GenerationRequest, RequestError  # pylint: disable=g-import-not-at-top
    prepared, rows = [], []
    for i, (obs, hist) in enumerate(zip(observations, histories)):
      text, images = self.prompt(obs, hist)
      try:
        prepared.append(self.engine.prepare(GenerationRequest(
            prompt=text, images=images, max_tokens=self.max_tokens, temperature=self.temperature)))
        rows.append(i)
      except RequestError:
        self.stats["too_long"] += 1
    out = [""] * len(observations)
    for i, result in zip(rows, self.engine.generate(prepared) if prepared else []):
      out[i] = result.text.strip()
    self.stats["rows"] += len(observations)
    return out


def load(path: str, config, fmt, temperature: float, seed: int = 0) -> OWVModelPolicy:
  """The policy trained in the workdir `path` (`serving.load_policy` rebuilds it from `config`)."""
  from jaxagent.serving.checkpoint import load_policy  # pylint: disable=g-import-not-at-top
  return OWVModelPolicy(load_policy(path, config=config), fmt, temperature=temperature,
                        max_tokens=int(config.sampling.max_tokens), max_batch=int(config.sampling.max_batch),
                        seed=seed)
