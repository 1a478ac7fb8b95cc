"""Batched KV-cache sampling: prefill and the whole decode loop inside one `jax.jit`.

Model protocol (what `sample` calls; `llama.Decoder` implements it, and a VLM either passes its merged
prompt embeddings as `prompt_embeds` with its decoder as `model`, or exposes the same three methods):

- `init_cache(batch, max_len, dtype) -> cache` (any pytree),
- `hidden_states(input_ids=None, *, inputs_embeds=None, attention_mask, cache) -> (hidden [B,T,E], cache)`;
  prefill passes the prompt (`input_ids` or `inputs_embeds`), each decode step passes `input_ids` [B,1],
- `logits(hidden [..., E]) -> float32 logits [..., V]`.

Prompts may be padded on either side (`prompt_mask` marks real tokens); each row continues from its own
last real token, so its first generated token is `tokens[:, 0]` whatever its prompt length. Generation
stops per row at an EOS id (the EOS is kept and counted in `lengths`; later slots hold `pad_id`) and for
the batch when every row stopped or `max_new_tokens` is reached. Stop *strings* are applied on the host
after decoding (`truncate_at_stop`, used by `generate`). `sample_rows` prefills the rows one at a time, each at
its own width, then runs the same decode: for prompts of very different lengths, where one padded prefill pays
every row at the longest width.

`logprobs` are log π(token | prefix) under the model's own distribution at temperature 1, i.e.
`log_softmax(logits)[token]` before temperature / top-k / top-p (what the OpenAI API reports);
`sample_logprobs` are the log-probs under the distribution each token was drawn from (temperature, top-k and top-p
applied; 0 when greedy): the behaviour policy an importance ratio divides by.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Sampling settings (hashable: one compilation per distinct config and shape, except the temperature, which
  is traced: every positive temperature shares one program, greedy has its own)."""
  max_new_tokens: int = 64
  temperature: float = 1.0  # 0 → greedy (argmax)
  top_k: int = 0  # 0 → off
  top_p: float = 1.0  # 1 → off
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0
  cache_dtype: str | None = None  # default: the model's compute dtype

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"SamplingConfig.max_new_tokens={self.max_new_tokens} must be ≥ 1")
    if self.temperature < 0:
      raise ValueError(f"SamplingConfig.temperature={self.temperature} must be ≥ 0 (0 is greedy)")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"SamplingConfig.top_p={self.top_p} must be in (0, 1]")
    if self.top_k < 0:
      raise ValueError(f"SamplingConfig.top_k={self.top_k} must be ≥ 0 (0 disables it)")
    object.__setattr__(self, "eos_ids", tuple(int(i) for i in np.atleast_1d(self.eos_ids)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SampleOutput:
  tokens: jax.Array  # [B, max_new_tokens] int32, pad_id after a row's end
  logprobs: jax.Array  # [B, max_new_tokens] float32, log_softmax(logits) at temperature 1; 0 after the end
  lengths: jax.Array  # [B] int32, generated tokens per row including the EOS
  sample_logprobs: jax.Array  # [B, max_new_tokens] float32, under the sampling distribution; 0 after the end


def filter_logits(logits: jax.Array, config: SamplingConfig, temperature: jax.Array | float | None = None
                  ) -> jax.Array:
  """Temperature, then top-k, then top-p (nucleus) on [B, V] float32 logits; removed entries are -inf.
  `temperature` (a traced scalar inside the sampler) overrides `config.temperature`."""
  logits = logits / (config.temperature if temperature is None else temperature)
  if config.top_k:
    kth = jax.lax.top_k(logits, config.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if config.top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    keep = (jnp.cumsum(probs, axis=-1) - probs) < config.top_p  # the top token is always kept
    cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return logits


def _choose(logits: jax.Array, key: jax.Array, config: SamplingConfig, temperature: jax.Array
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Sampled tokens [B], their temperature-1 log-probs [B] and their log-probs under the sampling distribution."""
  if config.temperature == 0:
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    sampled = jnp.zeros(tokens.shape, jnp.float32)
  else:
    filtered = filter_logits(logits, config, temperature)
    tokens = jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)
    sampled = jnp.take_along_axis(jax.nn.log_softmax(filtered, axis=-1), tokens[:, None], axis=-1)[:, 0]
  logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)[:, 0]
  return tokens, logprobs, sampled


def _is_eos(tokens: jax.Array, config: SamplingConfig) -> jax.Array:
  if not config.eos_ids:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(config.eos_ids, jnp.int32))


def decode_pad_rows(batch: int) -> int:
  """Rows the decode loop adds to a batch (copies of row 0 that no output keeps).

  On a GPU a batch of one makes every projection a matrix-vector product, which XLA rewrites as a multiply and a
  reduce when it has under 10M elements (its DotStrengthReduction pass); the attention's output projection then
  reads its weight three times. A second row keeps every projection a GEMM: on an H100, 1.35 → 1.09 ms a step
  for a 1B decoder (docs/results/performance.md). Elsewhere nothing is added.
  """
  return 1 if batch == 1 and jax.default_backend() == "gpu" else 0


def _sample(model, prompt_ids, prompt_embeds, prompt_mask, rng, temperature, config: SamplingConfig,
            pad_rows: int = 0) -> SampleOutput:
  b, t = prompt_mask.shape
  prompt_mask = prompt_mask.astype(bool)
  cache = model.init_cache(b, t + config.max_new_tokens, config.cache_dtype)
  if prompt_embeds is None:
    hidden, cache = model.hidden_states(prompt_ids, attention_mask=prompt_mask, cache=cache)
  else:
    hidden, cache = model.hidden_states(inputs_embeds=prompt_embeds, attention_mask=prompt_mask, cache=cache)
  last = t - 1 - jnp.argmax(prompt_mask[:, ::-1], axis=1)  # each row's last real token, either padding side
  logits = model.logits(jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0])
  return _decode(model, cache, logits, rng, temperature, config, pad_rows)


def _decode(model, cache, logits, rng, temperature, config: SamplingConfig, pad_rows: int = 0) -> SampleOutput:
  """The first token from the prompts' last logits [B, V], then the decode loop over the prefilled `cache`."""
  b, n = logits.shape[0], config.max_new_tokens
  rng, key = jax.random.split(rng)
  token, logprob, sampled = _choose(logits, key, config, temperature)
  tokens = jnp.full((b, n), config.pad_id, jnp.int32).at[:, 0].set(token)
  logprobs = jnp.zeros((b, n), jnp.float32).at[:, 0].set(logprob)
  sample_logprobs = jnp.zeros((b, n), jnp.float32).at[:, 0].set(sampled)
  done = _is_eos(token, config)
  lengths = jnp.ones((b,), jnp.int32)
  rows = (lambda x: jnp.concatenate([x, jnp.repeat(x[:1], pad_rows, axis=0)])) if pad_rows else (lambda x: x)
  cache = jax.tree.map(lambda x: rows(x) if jnp.ndim(x) else x, cache)

  def cond(state):
    step, _, _, _, _, _, done, _, _ = state
    return (step < n) & ~jnp.all(done)

  def body(state):
    step, token, cache, tokens, logprobs, sample_logprobs, done, lengths, rng = state
    hidden, cache = model.hidden_states(rows(token)[:, None], attention_mask=rows(~done)[:, None], cache=cache)
    rng, key = jax.random.split(rng)
    token, logprob, sampled = _choose(model.logits(hidden[:b, 0]), key, config, temperature)
    token = jnp.where(done, config.pad_id, token)
    logprob = jnp.where(done, 0.0, logprob)
    sampled = jnp.where(done, 0.0, sampled)
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, step))
    logprobs = jax.lax.dynamic_update_slice(logprobs, logprob[:, None], (0, step))
    sample_logprobs = jax.lax.dynamic_update_slice(sample_logprobs, sampled[:, None], (0, step))
    lengths = jnp.where(done, lengths, step + 1)
    done = done | _is_eos(token, config)
    return step + 1, token, cache, tokens, logprobs, sample_logprobs, done, lengths, rng

  state = (jnp.int32(1), token, cache, tokens, logprobs, sample_logprobs, done, lengths, rng)
  _, _, _, tokens, logprobs, sample_logprobs, _, lengths, _ = jax.lax.while_loop(cond, body, state)
  return SampleOutput(tokens=tokens, logprobs=logprobs, lengths=lengths, sample_logprobs=sample_logprobs)


_sample_jit = jax.jit(_sample, static_argnames=("config", "pad_rows"))


def sample(model, prompt_ids: jax.Array | None, prompt_mask: jax.Array, config: SamplingConfig = SamplingConfig(),
           *, rng: jax.Array | None = None, prompt_embeds: jax.Array | None = None,
           pad_rows: int | None = None) -> SampleOutput:
  """Generate up to `config.max_new_tokens` for each row of a padded prompt batch (see module docstring).

  prompt_ids [B, T] int (or `prompt_embeds` [B, T, E] for a VLM's merged prompt); prompt_mask [B, T] bool.
  The cache holds T + max_new_tokens slots. Callable inside an outer `jax.jit` too (`config` static).
  `pad_rows`: discarded rows the decode loop adds (default `decode_pad_rows(B)`; no output changes with it).
  """
  if (prompt_ids is None) == (prompt_embeds is None):
    raise ValueError("sample: pass exactly one of prompt_ids or prompt_embeds")
  prompt_mask = jnp.asarray(prompt_mask, bool)
  if not isinstance(prompt_mask, jax.core.Tracer) and not bool(jnp.all(jnp.any(prompt_mask, axis=1))):
    raise ValueError("sample: every row of prompt_mask needs at least one real token")
  rng = jax.random.key(0) if rng is None else rng
  ids = None if prompt_ids is None else jnp.asarray(prompt_ids, jnp.int32)
  # The temperature is traced (one compilation serves every positive temperature); only greedy vs sampled is
  # static, so the static config carries 0 or 1.
  static = dataclasses.replace(config, temperature=float(config.temperature > 0))
  pad_rows = decode_pad_rows(prompt_mask.shape[0]) if pad_rows is None else int(pad_rows)
  return _sample_jit(model, ids, prompt_embeds, prompt_mask, rng, jnp.float32(config.temperature), static, pad_rows)


def _last_logits(model, hidden, mask):
  """The logits [1, V] at a right-padded row's last real token."""
  last = jnp.sum(mask, axis=1, dtype=jnp.int32) - 1
  return model.logits(jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0])


@functools.partial(jax.jit, static_argnames=("cache_dtype",))
def _prefill_row(model, ids, mask, cache_dtype):
  """One prompt [1, w] (right-padded) through a cache of its own width: its last real token's logits [1, V]."""
  cache = model.init_cache(1, ids.shape[1], cache_dtype)
  hidden, cache = model.hidden_states(ids, attention_mask=mask, cache=cache)
  return _last_logits(model, hidden, mask), cache


@functools.partial(jax.jit, donate_argnums=(0,))
def _put_row(cache, row_cache, row):
  """`row_cache` (batch 1, width w) written into row `row`, slots [0, w), of the batch's cache."""
  def put(big, small):
    return jax.lax.dynamic_update_slice(big, small.astype(big.dtype), (row,) + (0,) * (big.ndim - 1))
  return cache.map_slots(put, row_cache)


@functools.partial(jax.jit, static_argnames=("length",))
def _prefill_after(model, prefix, shared, ids, mask, length: int):
  """A prompt whose first `shared` tokens an earlier prompt's row cache `prefix` holds: those keys kept (the rest
  of the row emptied, in a row of `length` slots), then the rest of the prompt, `ids` [1, s], from slot `shared`."""
  def fit(x):  # [1, L_prefix, ...] -> [1, length, ...]
    if x.shape[1] >= length:
      return x[:, :length]
    return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
  keep = jnp.arange(length, dtype=jnp.int32)[None] < shared
  cache = prefix.map_slots(fit, index=jnp.asarray(shared, jnp.int32), empty=False)
  cache = dataclasses.replace(cache, valid=cache.valid & keep)
  hidden, cache = model.hidden_states(ids, attention_mask=mask, cache=cache)
  return _last_logits(model, hidden, mask), cache


_decode_jit = jax.jit(_decode, static_argnames=("config", "pad_rows"))


def sample_rows(model, prompts: Sequence[np.ndarray], masks: Sequence[np.ndarray],
                config: SamplingConfig = SamplingConfig(), *, rng: jax.Array | None = None,
                pad_rows: int | None = None, prefixes: Sequence[tuple[Any, int] | None] | None = None,
                row_caches: list | None = None) -> SampleOutput:
  """`sample` on a batch whose rows are prefilled one at a time, each at its own width, then decoded together.

  prompts[r] / masks[r]: row r's ids and mask [1, w_r], real tokens first. A batch's prompts spread over every
  length (an agent's pages), and a batched prefill pads each row to the longest: its cost grows with the rows
  times the longest width, while one row at a time costs the sum of the rows' own widths, and the prefill is what
  acting pays on a CPU. Each row's cache then holds exactly what the right-padded batch's would (its prompt's
  keys, the rest of the row invalid), so the decode and its sampling keys are `sample`'s.
  `prefixes[r]`: (an earlier prompt's row cache, n) when row r's prompt begins with that prompt's first n tokens
  (an episode's next step): prompts[r] then holds only the tokens after them, and the cached keys are reused.
  `row_caches`: a list that receives each row's cache after its prefill (what a later call's `prefixes` reuse).
  Requires `llama.KVCache` (the decoders'); compiled per row width, not per batch's mix of widths.
  """
  prefixes = [None] * len(prompts) if prefixes is None else list(prefixes)
  if len(prompts) != len(masks) or len(prompts) != len(prefixes) or not prompts:
    raise ValueError(f"sample_rows: {len(prompts)} prompts, {len(masks)} masks and {len(prefixes)} prefixes; need "
                     "one mask and one prefix (or None) per prompt, ≥ 1 prompt")
  lengths = [int(np.shape(m)[1]) if p is None else prompt_bucket(p[1] + int(np.shape(m)[1]))
             for m, p in zip(masks, prefixes)]
  width = max(lengths)
  rng = jax.random.key(0) if rng is None else rng
  static = dataclasses.replace(config, temperature=float(config.temperature > 0))
  cache = model.init_cache(len(prompts), width + config.max_new_tokens, config.cache_dtype)
  logits = []
  for r, (ids, mask, prefix, length) in enumerate(zip(prompts, masks, prefixes, lengths)):
    if not np.any(mask):
      raise ValueError(f"sample_rows: row {r}'s mask has no real token")
    ids, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool)
    if prefix is None:
      row_logits, row_cache = _prefill_row(model, ids, mask, config.cache_dtype)
    else:
      row_logits, row_cache = _prefill_after(model, prefix[0], jnp.int32(prefix[1]), ids, mask, length=length)
    cache = _put_row(cache, row_cache, jnp.int32(r))
    logits.append(row_logits)
    if row_caches is not None:
      row_caches.append(row_cache)
  cache = dataclasses.replace(cache, index=jnp.int32(width), empty=False)
  pad_rows = decode_pad_rows(len(prompts)) if pad_rows is None else int(pad_rows)
  return _decode_jit(model, cache, jnp.concatenate(logits), rng, jnp.float32(config.temperature), static, pad_rows)


def prompt_bucket(n: int, floor: int = 64) -> int:
  """Prompt width compiled for a longest prompt of `n` tokens: multiples of 64 up to 512, then four an octave
  (2,666 → 3,072, not 4,096). The prefill's cost grows with the width, and an agent's prompts (a page each step)
  spread over every length: a power of two pads the benchmark's mean prompt by 54 %, a quarter octave pads any
  prompt over 512 tokens by under 25 %, for four compilations an octave where a power of two had one."""
  n = max(int(n), floor)
  step = max(floor, 1 << max(0, (n - 1).bit_length() - 3))
  return -(-n // step) * step


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
  """Cut `text` before the earliest occurrence of any stop string."""
  cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=len(text))
  return text[:cut]


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def generate(model, tokenizer, prompts: list[str], config: SamplingConfig | None = None, *,
             stop: Sequence[str] = (), rng: jax.Array | None = None, pad_to_multiple: int = 16,
             **config_kwargs: Any) -> list[str]:
  """Text in, text out: tokenise (right-padded to a multiple of `pad_to_multiple` to limit recompiles),
  sample, decode each row up to its length, cut at the first stop string.

  EOS ids default to the tokenizer's `eos_token_id`; keyword arguments override `SamplingConfig` fields.
  """
  if config is None:
    eos = () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
    config_kwargs.setdefault("eos_ids", eos)
    config_kwargs.setdefault("pad_id", tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    config = SamplingConfig(**config_kwargs)
  elif config_kwargs:
    config = dataclasses.replace(config, **config_kwargs)
  encoded = [tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
  width = _round_up(max(len(e) for e in encoded), pad_to_multiple)
  ids = np.full((len(prompts), width), config.pad_id, np.int32)
  mask = np.zeros((len(prompts), width), bool)
  for row, e in enumerate(encoded):
    ids[row, :len(e)] = e
    mask[row, :len(e)] = True
  out = jax.device_get(sample(model, ids, mask, config, rng=rng))
  texts = [tokenizer.decode(out.tokens[row, :out.lengths[row]].tolist(), skip_special_tokens=True)
           for row in range(len(prompts))]
  return [truncate_at_stop(text, stop) for text in texts]
