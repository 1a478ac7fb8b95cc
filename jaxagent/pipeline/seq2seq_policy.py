"""An AutoUI checkpoint as an acting `Policy`: `VLMPolicy`'s interface over an encoder-decoder.

The serving engine is decoder-only, so AutoUI (`config.model.kind="autoui"`) acts here: each row's turns are
encoded as training encoded them (`data.seq2seq.prompt_ids`, its one screenshot through the frozen encoder's
preprocessing) and `ScreenAutoUI.generate` runs jitted over batches padded to fixed buckets (rows to a power of
two up to `max_batch`, prompts to a multiple of `PROMPT_BUCKET` tokens), so a rollout compiles once per bucket.
"""

from __future__ import annotations

import collections
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import types
from jaxagent.data import seq2seq
from jaxagent.pipeline.policy import PromptFn, inference_mesh
from jaxagent.serving.checkpoint import LoadedPolicy, load_policy

PROMPT_BUCKET = 64
MAX_PROMPT_TOKENS = 512  # DigiRL's tokenizer `max_length`


def _bucket_rows(n: int, max_batch: int) -> int:
  return min(max_batch, 1 << max(n - 1, 0).bit_length())


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature", "eos_id"))
def _generate(graphdef, state, input_ids, attention_mask, images, rng, *, max_new_tokens, temperature, eos_id):
  model = nnx.merge(graphdef, state)
  return model.generate(input_ids, attention_mask, images, max_new_tokens, temperature=temperature, rng=rng,
                        eos_id=eos_id)


class Seq2SeqPolicy:
  """`types.Policy` over an AutoUI `LoadedPolicy`: `fmt` parses the replies, `prompt_fn` builds each row's turns
  and its screenshot (the first image; AutoUI reads one). A row whose prompt exceeds `max_prompt_tokens` gets
  the empty reply and is counted in `stats["too_long"]`, as `VLMPolicy` does."""

  def __init__(self, loaded: LoadedPolicy, fmt, prompt_fn: PromptFn, *, temperature: float, max_tokens: int,
               max_batch: int = 32, seed: int = 0, max_prompt_tokens: int = MAX_PROMPT_TOKENS):
    if loaded.kind != "autoui":
      raise ValueError(f"Seq2SeqPolicy acts with AutoUI checkpoints; {loaded.source} is a {loaded.kind!r} model "
                       "(use pipeline.policy.VLMPolicy)")
    self.loaded, self.fmt, self.prompt_fn = loaded, fmt, prompt_fn
    self.temperature, self.max_tokens, self.max_batch = float(temperature), int(max_tokens), int(max_batch)
    self.max_prompt_tokens = int(max_prompt_tokens)
    self.graphdef, self.state = nnx.split(loaded.model)
    self.rng = jax.random.key(seed)
    self.stats = collections.Counter()

  def _run(self, prompts: list[list[int]], screens: list, temperature: float) -> list[str]:
    tok, pad = self.loaded.tokenizer, self.loaded.pad_id
    rows = _bucket_rows(len(prompts), self.max_batch)
    length = -(-max(len(p) for p in prompts) // PROMPT_BUCKET) * PROMPT_BUCKET
    ids, mask = np.full((rows, length), pad, np.int32), np.zeros((rows, length), np.int32)
    for i, p in enumerate(prompts):
      ids[i, :len(p)], mask[i, :len(p)] = p, 1
    mask[len(prompts):, 0] = 1  # padding rows attend to one token, so no softmax is over nothing
    pixels = np.asarray(self.loaded.preprocess(screens), np.float32)
    images = np.zeros((rows,) + pixels.shape[1:], np.float32)
    images[:len(screens)] = pixels
    self.rng, key = jax.random.split(self.rng)
    out = np.asarray(_generate(self.graphdef, self.state, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(images),
                               key, max_new_tokens=self.max_tokens, temperature=float(temperature),
                               eos_id=int(tok.eos_token_id)))
    texts = []
    for row in out[:len(prompts)].tolist():
      end = row.index(tok.eos_token_id) if tok.eos_token_id in row else len(row)
      texts.append(tok.decode(row[:end], skip_special_tokens=True).strip())
    return texts

  def generate(self, turns: Sequence[list[dict]], images: Sequence[list], temperature: float | None = None
               ) -> list[str]:
    """One reply per row (conversation turns + their images), stripped; "" for a prompt that does not fit."""
    t = self.temperature if temperature is None else float(temperature)
    keep = []
    for i, (row_turns, row_images) in enumerate(zip(turns, images)):
      ids = seq2seq.prompt_ids(self.loaded.tokenizer, row_turns)
      if len(ids) > self.max_prompt_tokens:
        self.stats["too_long"] += 1
        continue
      if len(row_images) != 1:
        raise ValueError(f"AutoUI reads one screenshot per prompt; row {i} has {len(row_images)}")
      keep.append((i, ids, row_images[0]))
    out = [""] * len(turns)
    for start in range(0, len(keep), self.max_batch):
      chunk = keep[start:start + self.max_batch]
      for (i, _, _), text in zip(chunk, self._run([c[1] for c in chunk], [c[2] for c in chunk], t)):
        out[i] = text
    self.stats["rows"] += len(turns)
    return out

  def act(self, observations: Sequence[types.Observation], histories: Sequence[list[types.Step]]) -> list[str]:
    prompts = [self.prompt_fn(o, h) for o, h in zip(observations, histories)]
    return self.generate([p[0] for p in prompts], [p[1] for p in prompts])


def load_seq2seq_policy(path: str, config, fmt, prompt_fn: PromptFn, temperature: float,
                        seed: int = 0) -> Seq2SeqPolicy:
  """The AutoUI trained in the workdir `path`, sampled with the recipe `config`'s `sampling` token budget and
  batch (as `pipeline.policy.load_vlm_policy`)."""
  return Seq2SeqPolicy(load_policy(path, mesh=inference_mesh(config)), fmt, prompt_fn, temperature=temperature,
                       max_tokens=int(config.sampling.max_tokens), max_batch=int(config.sampling.max_batch), seed=seed)
