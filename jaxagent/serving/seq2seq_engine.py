"""The batch engine for an AutoUI encoder-decoder (`config.model.kind="autoui"`): `Engine`'s requests and results.

Each prompt is the encoder's text as training encoded it (`data.seq2seq.prompt_text`, EOS appended), its one
screenshot through the frozen encoder's preprocessing; `ScreenAutoUI.generate` runs jitted over batches padded to
fixed buckets (rows to a power of two up to `max_batch`, prompts to a multiple of `PROMPT_BUCKET` tokens), so a
rollout compiles once per bucket.
"""

from __future__ import annotations

import collections
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.data import seq2seq
from jaxagent.serving.checkpoint import LoadedModel
from jaxagent.serving.engine import GenerationRequest, GenerationResult, RequestError, _Prepared

PROMPT_BUCKET = 64
MAX_PROMPT_TOKENS = 512  # DigiRL's tokenizer `max_length`


def _bucket_rows(n: int, max_batch: int) -> int:
  return min(max_batch, 1 << max(n - 1, 0).bit_length())


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature", "eos_id"))
def _generate(graphdef, state, input_ids, attention_mask, images, rng, *, max_new_tokens, temperature, eos_id):
  model = nnx.merge(graphdef, state)
  return model.generate(input_ids, attention_mask, images, max_new_tokens, temperature=temperature, rng=rng,
                        eos_id=eos_id)


class Seq2SeqEngine:
  """`prepare` / `generate` over an AutoUI `LoadedModel`; a prompt longer than `max_prompt_tokens` is a
  RequestError, as the decoder engine's over its context."""

  def __init__(self, policy: LoadedModel, *, max_batch: int = 8, max_new_tokens: int = 512, seed: int = 0,
               max_prompt_tokens: int = MAX_PROMPT_TOKENS):
    if policy.kind != "autoui":
      raise ValueError(f"Seq2SeqEngine runs AutoUI checkpoints; {policy.source} is a {policy.kind!r} model")
    self.policy = policy
    self.max_batch, self.max_new_tokens = int(max_batch), int(max_new_tokens)
    self.max_prompt_tokens = int(max_prompt_tokens)
    self.graphdef, self.state = nnx.split(policy.model)
    self._key = jax.random.key(seed)
    self._stats = collections.Counter()

  def training_prompt(self, turns: list[dict[str, str]]) -> str:
    """The encoder's text of `turns` (their human turns, `<image>` markers dropped)."""
    return seq2seq.prompt_text(turns)

  def prepare(self, request: GenerationRequest) -> _Prepared:
    if not isinstance(request.prompt, str):
      raise RequestError("an AutoUI engine takes the encoder's text (training_prompt), not chat messages")
    if not 1 <= request.max_tokens <= self.max_new_tokens:
      raise RequestError(f"max_tokens={request.max_tokens} must be in [1, {self.max_new_tokens}]")
    if len(request.images) != 1:
      raise ValueError(f"AutoUI reads one screenshot per prompt; this request has {len(request.images)}")
    ids = seq2seq.encoder_ids(self.policy.tokenizer, request.prompt)
    if len(ids) > self.max_prompt_tokens:
      raise RequestError(f"the prompt has {len(ids)} tokens; this engine accepts at most {self.max_prompt_tokens}")
    return _Prepared(request, np.asarray(ids, np.int32), None)

  def generate(self, requests: Sequence[GenerationRequest | _Prepared]) -> list[GenerationResult]:
    prepared = [r if isinstance(r, _Prepared) else self.prepare(r) for r in requests]
    groups: dict[float, list[int]] = collections.defaultdict(list)
    for i, p in enumerate(prepared):
      groups[float(p.request.temperature)].append(i)
    results: list[GenerationResult | None] = [None] * len(prepared)
    for temperature, members in groups.items():
      for start in range(0, len(members), self.max_batch):
        chunk = members[start:start + self.max_batch]
        for i, res in zip(chunk, self._run([prepared[i] for i in chunk], temperature)):
          results[i] = res
    self._stats["requests"] += len(prepared)
    return results  # type: ignore[return-value]

  def _run(self, batch: list[_Prepared], temperature: float) -> list[GenerationResult]:
    tok, pad = self.policy.tokenizer, self.policy.pad_id
    rows = _bucket_rows(len(batch), self.max_batch)
    length = -(-max(len(p.ids) for p in batch) // PROMPT_BUCKET) * PROMPT_BUCKET
    ids, mask = np.full((rows, length), pad, np.int32), np.zeros((rows, length), np.int32)
    for i, p in enumerate(batch):
      ids[i, :len(p.ids)], mask[i, :len(p.ids)] = p.ids, 1
    mask[len(batch):, 0] = 1  # padding rows attend to one token, so no softmax is over nothing
    pixels = np.asarray(self.policy.preprocess([p.request.images[0] for p in batch]), np.float32)
    images = np.zeros((rows,) + pixels.shape[1:], np.float32)
    images[:len(batch)] = pixels
    new_tokens = max(p.request.max_tokens for p in batch)
    self._key, key = jax.random.split(self._key)
    out = np.asarray(_generate(self.graphdef, self.state, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(images),
                               key, max_new_tokens=new_tokens, temperature=float(temperature),
                               eos_id=int(tok.eos_token_id)))
    results = []
    for p, row in zip(batch, out[:len(batch)].tolist()):
      row = row[:p.request.max_tokens]
      end = row.index(tok.eos_token_id) if tok.eos_token_id in row else len(row)
      results.append(GenerationResult(tok.decode(row[:end], skip_special_tokens=True), len(p.ids), end,
                                      "stop" if end < len(row) else "length"))
    self._stats["sampler_calls"] += 1
    return results

  def stats(self) -> dict:
    return dict(self._stats)
