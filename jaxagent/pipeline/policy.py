"""A trained model as an acting `Policy`, prompted byte for byte as it was trained.

The training samples are conversations (`{"from": "human"|"gpt", "value"}` turns with `<image>` markers)
rendered by `data.conversation.render_chat`; the policy builds the same turns for the current observation (the
recipe's `prompt_fn`), renders them with the same template, and hands the engine the text up to the assistant's
header
with the images its `<image>` markers name. All rows of one `act` call are one engine call (one sampler batch).
"""

from __future__ import annotations

import collections
from typing import Callable, Sequence

from jaxagent import types
from jaxagent.data import conversation
from jaxagent.serving.checkpoint import LoadedPolicy, load_policy
from jaxagent.serving.engine import GenerationRequest, RequestError
from jaxagent.serving.qwen_engine import engine_for

# (observation, history) -> (the human turns so far, as training samples hold them; the images they name)
PromptFn = Callable[[types.Observation, Sequence[types.Step]], tuple[list[dict], list]]


def render_prompt(turns: list[dict], tokenizer) -> str:
  """The training render of `turns` followed by the assistant's header: the text the model continues.

  The engine tokenises a text prompt with the tokenizer's special tokens; a template that writes the BOS itself
  (Llama-3's) loses its textual one here, so the ids are the ones training saw.
  """
  text = conversation.generation_prompt(turns, tokenizer)
  bos = tokenizer.bos_token
  if bos and text.startswith(bos) and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]:
    text = text[len(bos):]
  return text


class VLMPolicy:
  """`types.Policy` over a `LoadedPolicy`: `fmt` parses the replies, `prompt_fn` builds each row's turns.

  A row whose prompt exceeds the model's context gets the empty reply (the format's parse error, as a server's
  400 would give the original agent) and is counted in `stats["too_long"]`.
  """

  def __init__(self, loaded: LoadedPolicy, fmt, prompt_fn: PromptFn, *, temperature: float, max_tokens: int,
               max_batch: int = 32, seed: int = 0):
    self.engine = engine_for(loaded, max_batch=max_batch, max_new_tokens=max_tokens, seed=seed)
    self.loaded, self.fmt, self.prompt_fn = loaded, fmt, prompt_fn
    self.temperature, self.max_tokens = float(temperature), int(max_tokens)
    self.stats = collections.Counter()

  def generate(self, turns: Sequence[list[dict]], images: Sequence[list], temperature: float | None = None
               ) -> list[str]:
    """One reply per row (conversation turns + their images), stripped; "" for a prompt that does not fit."""
    t = self.temperature if temperature is None else float(temperature)
    prepared, rows = [], []
    for i, (row_turns, row_images) in enumerate(zip(turns, images)):
      try:
        prepared.append(self.engine.prepare(GenerationRequest(
            prompt=render_prompt(row_turns, self.loaded.tokenizer), images=list(row_images), max_tokens=self.max_tokens,
            temperature=t)))
        rows.append(i)
      except RequestError:
        self.stats["too_long"] += 1
    out = [""] * len(turns)
    for i, result in zip(rows, self.engine.generate(prepared) if prepared else []):
      out[i] = result.text.strip()
    self.stats["rows"] += len(turns)
    return out

  def act(self, observations: Sequence[types.Observation], histories: Sequence[list[types.Step]]) -> list[str]:
    prompts = [self.prompt_fn(o, h) for o, h in zip(observations, histories)]
    return self.generate([p[0] for p in prompts], [p[1] for p in prompts])


def inference_mesh(config):
  """The mesh of this process's devices the recipe's policies run on (`config.inference_mesh`; one device for a
  config written before the key existed)."""
  from jaxagent import sharding  # pylint: disable=g-import-not-at-top
  return sharding.local_mesh(dict(config.get("inference_mesh", {})))


def load_vlm_policy(path: str, config, fmt, prompt_fn: PromptFn, temperature: float, seed: int = 0) -> VLMPolicy:
  """The policy trained in the workdir `path` (rebuilt from the `config.json` its training wrote), sampled with
  the recipe `config`'s `sampling` token budget and batch."""
  return VLMPolicy(load_policy(path, mesh=inference_mesh(config)), fmt, prompt_fn, temperature=temperature,
                   max_tokens=int(config.sampling.max_tokens), max_batch=int(config.sampling.max_batch), seed=seed)
