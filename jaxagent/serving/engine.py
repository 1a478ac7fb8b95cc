"""The inference engine: prompts (chat messages or text, with images) -> one jitted sampler call per batch.

Rendering follows training exactly: chat messages go through the tokenizer's chat template (the template the
IL data was rendered with), each `<image>` placeholder expands to the model's `num_image_tokens` image-token
ids, and images are preprocessed as the IL pipeline does. Shapes are bucketed (rows and images to powers of two,
prompt length to quarter octaves from 64 (`prompt_bucket`), new tokens to multiples of 32) so a server compiles a
handful of programs, not one per request; padded rows are one-token prompts whose output is dropped. A decoder
batch of long prompts of different widths is prefilled a row at a time, each at its own width, then decoded
together (`prefill="rows"`, the default; `sampler.sample_rows`): the same tokens, without paying every row at the
longest width. With `prefix_cache_bytes` > 0, a prompt that begins as a recent one did (an episode's next step)
prefills only what follows (`serving.prefix_cache`, `fit_prefix`): 3.9× faster a prefill where 1,500 of 1,800
tokens are cached, but off by default, as on the benchmark's prompts (~22 % shared, the rest padded to its width)
it skips ~4 % of the tokens (docs/results/performance.md#prefix-cache). `prefill="batch"` keeps one padded prefill.

Requests in one batch may differ in prompt, length and `max_tokens` (each row is cut at its own), but one
sampler call has one setting, so `generate` splits a batch by (temperature, top_p, top_k) and calls the
sampler once per group (the temperature is traced: groups that differ only in it share a compilation).
`stats()` counts requests, sampler calls, rows and tokens: the evidence that concurrent requests were batched.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from jaxagent.data import conversation
from jaxagent.data.tokenizer import IMAGE_TOKEN
from jaxagent.models import sampler
from jaxagent.serving.checkpoint import LoadedModel
from jaxagent.serving.prefix_cache import PrefixCache


class RequestError(ValueError):
  """A request this engine cannot serve; the message names the field and the fix (the server's 400)."""


@dataclasses.dataclass
class GenerationRequest:
  """One prompt: HF-style chat messages (image parts carry arrays / PIL images) or a rendered string whose
  `<image>` placeholders match `images` in order."""

  prompt: str | list[dict[str, Any]]
  images: Sequence[Any] = ()  # only with a string prompt
  max_tokens: int = 256
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop: Sequence[str] = ()
  echo: bool = False  # also return the prompt tokens' logprobs (with max_tokens=0: only them)
  seed: int | None = None  # the continuous engine's per-request sampling seed (None: the server's sequence)

  def sampling_key(self) -> tuple[float, float, int]:
    return (float(self.temperature), float(self.top_p), int(self.top_k))


@dataclasses.dataclass
class GenerationResult:
  text: str
  prompt_tokens: int
  completion_tokens: int
  finish_reason: str  # "stop" (EOS or a stop string) | "length"
  # Token level: every sampled token (those past a stop string too), the prompt's ids, and log-probs
  tokens: list[int] = dataclasses.field(default_factory=list)
  token_logprobs: list[float] = dataclasses.field(default_factory=list)  # log π(token | prefix) at temperature 1
  top_logprobs: list[tuple[list[int], list[float]]] = dataclasses.field(default_factory=list)  # continuous engine
  prompt_ids: list[int] = dataclasses.field(default_factory=list)
  prompt_logprobs: tuple[list[float], list, list] | None = None  # with echo: tokens 1.. of the prompt
  sample_logprobs: list[float] = dataclasses.field(default_factory=list)  # under the sampling distribution (batch)


@dataclasses.dataclass
class _Prepared:
  request: GenerationRequest
  ids: np.ndarray
  pixels: np.ndarray | None  # [n, S, S, 3] preprocessed


PREFILL_MODES = ("rows", "batch")
ROW_PREFILL_MIN_WIDTH = 512  # below it a prefill costs less than the calls a row at a time adds


def _pow2(n: int, floor: int) -> int:
  return max(floor, 1 << max(0, int(n) - 1).bit_length())


prompt_bucket = sampler.prompt_bucket  # the engines' prompt widths (quarter octaves above 512 tokens)


def _decode_bucket(n: int) -> int:
  """Decode steps compiled for a batch whose longest request asks `n` new tokens: `n` rounded up to a multiple
  of 32. A power of two would let one rambling row (a sampled action that never ends) run up to 2× the longest
  request's steps over a 2× longer cache (160 → 256), for output that is cut at `max_tokens` anyway."""
  return -(-max(1, int(n)) // 32) * 32


def _message_images(messages: Sequence[dict[str, Any]]) -> list[Any]:
  return [p["image"] for m in messages if not isinstance(m.get("content"), str)
          for p in m["content"] if p.get("type") == "image"]


def fit_prefix(hit: tuple | None, n: int) -> tuple | None:
  """A prefix-cache hit (row cache, shared tokens) for a prompt of `n` tokens, its reuse cut so that the row the
  rest is prefilled into is no wider than the whole prompt's own width: the rest is padded to its own width
  (`prompt_bucket`), and the keys kept before it had widened the row (1,750 tokens, 450 cached: 1,536 + 450 slots,
  a row of 2,048 where the prompt alone takes 1,792). The same tokens are prefilled (the rest still fits its
  width); fewer slots are attended to, in the prefill and in every decode step. None when nothing is left to reuse."""
  if hit is None:
    return None
  cache, shared = hit
  shared = min(shared, prompt_bucket(n) - prompt_bucket(n - shared))
  return (cache, shared) if shared > 0 else None


class Engine:
  """Batched generation over a `LoadedModel`. Thread-safe: concurrent `generate` calls run one at a time."""

  def __init__(self, policy: LoadedModel, *, max_batch: int = 8, max_prompt_tokens: int | None = None,
               max_new_tokens: int = 512, seed: int = 0, prefill: str = "rows",
               prefix_cache_bytes: int = 0):
    if max_batch < 1:
      raise ValueError(f"Engine.max_batch={max_batch} must be >= 1")
    if prefill not in PREFILL_MODES:
      raise ValueError(f"Engine.prefill={prefill!r}; expected one of {PREFILL_MODES}")
    self.prefill = prefill
    self._prefixes = PrefixCache(prefix_cache_bytes) if prefill == "rows" and prefix_cache_bytes > 0 else None
    self.policy = policy
    self.max_batch = int(max_batch)
    self.max_prompt_tokens = int(max_prompt_tokens or policy.context_length)
    self.max_new_tokens = int(max_new_tokens)
    self._key = jax.random.key(seed)
    self._calls = 0  # sampler calls so far: each folds its count into the key
    self._lock = threading.Lock()
    self._stats_lock = threading.Lock()
    self._stats = collections.Counter()
    self._batch_sizes = collections.Counter()
    self._shapes: set[tuple] = set()

  # ---- rendering
  def training_prompt(self, turns: list[dict[str, str]]) -> str:
    """The training render of conversation `turns` followed by the assistant's header: the text the model
    continues. The engine tokenises a text prompt with the tokenizer's special tokens; a template that writes the
    BOS itself (Llama-3's) loses its textual one here, so the ids are the ones training saw."""
    tokenizer = self.policy.tokenizer
    text = conversation.generation_prompt(turns, tokenizer)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]:
      text = text[len(bos):]
    return text

  def render(self, prompt: str | list[dict[str, Any]]) -> str:
    """The text the model continues: a string as is; chat messages of users and assistants as training renders
    them (`conversation.generation_prompt`: our template or the checkpoint's, the same bytes); with other roles
    (a system prompt) through the checkpoint's template directly."""
    if isinstance(prompt, str):
      return prompt
    turns = conversation.from_messages(list(prompt))
    if turns is not None:  # users and assistants only: the training render (ours, or the checkpoint's template)
      try:
        return conversation.generation_prompt(turns, self.policy.tokenizer)
      except Exception as e:  # pylint: disable=broad-except  # a template error is the caller's malformed input
        raise RequestError(f"messages cannot be rendered with the chat template: {type(e).__name__}: {e}") from None
    try:
      return self.policy.tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    except Exception as e:  # pylint: disable=broad-except  # a template error is the caller's malformed input
      raise RequestError(f"messages cannot be rendered with the chat template: {type(e).__name__}: {e}") from None

  def prepare(self, request: GenerationRequest) -> _Prepared:
    """Token ids (image placeholders expanded) and preprocessed pixels; raises RequestError."""
    if request.max_tokens < (0 if request.echo else 1) or request.max_tokens > self.max_new_tokens:
      raise RequestError(f"max_tokens={request.max_tokens} must be in [1, {self.max_new_tokens}] (the server's "
                         "--max-new-tokens)")
    if request.temperature < 0 or not 0 < request.top_p <= 1 or request.top_k < 0:
      raise RequestError(f"temperature={request.temperature} must be >= 0, top_p={request.top_p} in (0, 1], "
                         f"top_k={request.top_k} >= 0")
    text = self.render(request.prompt)
    if isinstance(request.prompt, str):
      images = list(request.images)
      if text.count(IMAGE_TOKEN) != len(images):
        raise RequestError(f"the prompt has {text.count(IMAGE_TOKEN)} {IMAGE_TOKEN} placeholder(s) but "
                           f"{len(images)} image(s) were sent; send one image per placeholder, in order")
    else:
      images = _message_images(request.prompt)
    tok = self.policy.tokenizer
    ids = np.asarray(tok(text, add_special_tokens=isinstance(request.prompt, str))["input_ids"], np.int32)
    pixels = None
    if self.policy.kind == "vlm":
      image_id = self.policy.image_token_id
      if int(np.sum(ids == image_id)) != len(images):
        raise RequestError(f"the rendered prompt holds {int(np.sum(ids == image_id))} image tokens for "
                           f"{len(images)} images; do not write {IMAGE_TOKEN} in text parts")
      ids = conversation.expand_images(ids, image_id, self.policy.num_image_tokens,
                                       self.policy.image_wrap_id)[0].astype(np.int32)
      if images:
        try:
          pixels = self.policy.preprocess(images)
        except (ValueError, OSError, TypeError) as e:
          raise RequestError(f"an image cannot be read: {e}") from None
    if len(ids) > self.max_prompt_tokens:
      raise RequestError(f"the prompt has {len(ids)} tokens (images expanded) but this server accepts at most "
                         f"{self.max_prompt_tokens}; shorten the conversation or send fewer images")
    return _Prepared(request, ids, pixels)

  # ---- generation
  def generate(self, requests: Sequence[GenerationRequest | _Prepared]) -> list[GenerationResult]:
    """One result per request, in order. Raises RequestError for a malformed request (before any sampling)."""
    prepared = [r if isinstance(r, _Prepared) else self.prepare(r) for r in requests]
    results: list[GenerationResult | None] = [None] * len(prepared)
    groups: dict[tuple, list[int]] = collections.defaultdict(list)
    for i, p in enumerate(prepared):
      groups[p.request.sampling_key()].append(i)
    for key, members in groups.items():
      for start in range(0, len(members), self.max_batch):
        chunk = members[start:start + self.max_batch]
        for i, res in zip(chunk, self._generate_batch([prepared[i] for i in chunk], key)):
          results[i] = res
    with self._stats_lock:
      self._stats["requests"] += len(prepared)
    return results  # type: ignore[return-value]

  def _sample(self, batch: list[_Prepared], ids: np.ndarray, mask: np.ndarray, config, rng):
    """One sampler call over a padded batch -> (its output, the image slots it was compiled for)."""
    policy = self.policy
    if policy.kind == "vlm":
      from jaxagent.models import vlm  # pylint: disable=g-import-not-at-top
      pix = [p.pixels for p in batch if p.pixels is not None]
      side = policy.preprocess.crop_size or policy.preprocess.size
      n_img = sum(len(x) for x in pix)
      images = np.zeros((_pow2(n_img, 1), side, side, 3), np.float32)
      if n_img:
        images[:n_img] = np.concatenate(pix)
      return vlm.sample(policy.model, ids, mask, images, config, rng=rng), len(images)
    hits = self._cached_prefixes(batch)
    if self._prefill_by_row(batch, ids.shape, hits):
      return self._sample_rows(batch, hits, len(ids), config, rng), 0
    return sampler.sample(policy.model, ids, mask, config, rng=rng), 0

  def clear_prefix_cache(self) -> None:
    """Forget every cached prompt (a benchmark's untimed pass; the cache also empties itself on new weights)."""
    if self._prefixes is not None:
      self._prefixes.check_weights(None)

  def _cached_prefixes(self, batch: list[_Prepared]) -> list[tuple | None]:
    """Each row's longest cached prefix (row cache, tokens), taken out of the prefix cache; None where none."""
    if self._prefixes is None or self.policy.kind != "decoder":
      return [None] * len(batch)
    self._prefixes.check_weights(tuple(map(id, jax.tree.leaves(nnx.state(self.policy.model)))))
    return [self._prefixes.take(p.ids) for p in batch]

  def _prefill_by_row(self, batch: list[_Prepared], shape: tuple[int, int], hits: list[tuple | None]) -> bool:
    """Whether this decoder batch is prefilled one row at a time (`sampler.sample_rows`): with `prefill="rows"`,
    when a row continues a cached prefix, when the longest prompt is over `ROW_PREFILL_MIN_WIDTH` tokens and either
    the prefix cache is on (it keeps the rows' caches) or the rows' own widths sum to fewer tokens than the padded
    batch holds (the batched prefill pays rows × the longest width); short prompts of one width keep one call."""
    rows, width = shape
    if self.prefill != "rows" or self.policy.kind != "decoder":
      return False
    if any(hits) or (self._prefixes is not None and width >= ROW_PREFILL_MIN_WIDTH):
      return True  # (the rows' caches are what the prefix cache keeps)
    if rows == 1 or width < ROW_PREFILL_MIN_WIDTH:
      return False
    own = sum(prompt_bucket(len(p.ids)) for p in batch) + prompt_bucket(1) * (rows - len(batch))
    return own < rows * width

  def _sample_rows(self, batch: list[_Prepared], hits: list[tuple | None], rows: int, config, rng):
    """`sampler.sample_rows` over the batch (and its padding rows: one-token prompts), each row after its cached
    prefix where it has one; every row's cache then goes into the prefix cache."""
    pad = self.policy.pad_id
    hits = [fit_prefix(h, len(p.ids)) for h, p in zip(hits, batch)] + [None] * (rows - len(batch))
    prompts, masks = [], []
    for r in range(rows):
      tokens = batch[r].ids[hits[r][1] if hits[r] else 0:] if r < len(batch) else [pad]
      ids = np.full((1, prompt_bucket(len(tokens))), pad, np.int32)
      ids[0, :len(tokens)] = tokens
      prompts.append(ids)
      masks.append(np.arange(ids.shape[1])[None] < len(tokens))
    caches: list = []
    out = sampler.sample_rows(self.policy.model, prompts, masks, config, rng=rng, row_caches=caches,
                              prefixes=hits)
    if self._prefixes is not None:
      for p, cache in zip(batch, caches):
        self._prefixes.put(p.ids, cache)
    with self._stats_lock:
      self._stats["row_prefilled_batches"] += 1
      self._stats["prefix_tokens_reused"] += sum(h[1] for h in hits if h)
    return out

  def _generate_batch(self, batch: list[_Prepared], key: tuple[float, float, int]) -> list[GenerationResult]:
    temperature, top_p, top_k = key
    policy = self.policy
    rows = _pow2(len(batch), 1)
    width = prompt_bucket(max(len(p.ids) for p in batch))
    new = min(_decode_bucket(max(p.request.max_tokens for p in batch)), _decode_bucket(self.max_new_tokens))
    config = sampler.SamplingConfig(max_new_tokens=new, temperature=temperature, top_p=top_p, top_k=top_k,
                                    eos_ids=policy.eos_ids, pad_id=policy.pad_id)
    ids = np.full((rows, width), policy.pad_id, np.int32)
    mask = np.zeros((rows, width), bool)
    mask[:, 0] = True  # padding rows: a one-token prompt
    for r, p in enumerate(batch):
      ids[r, :len(p.ids)] = p.ids
      mask[r, :len(p.ids)] = True
    with self._lock:
      self._calls += 1
      rng = jax.random.fold_in(self._key, self._calls)
      t0 = time.perf_counter()
      out, image_slots = self._sample(batch, ids, mask, config, rng)
      out = jax.device_get(out)
      elapsed = time.perf_counter() - t0
    shape = (rows, width, new, image_slots, key)
    results = []
    for r, p in enumerate(batch):
      n = min(int(out.lengths[r]), p.request.max_tokens)
      tokens = out.tokens[r, :n].tolist()
      hit_eos = n > 0 and tokens[-1] in policy.eos_ids
      text = policy.tokenizer.decode(tokens, skip_special_tokens=True)
      cut = sampler.truncate_at_stop(text, p.request.stop)
      finish = "stop" if hit_eos or len(cut) < len(text) else "length"
      results.append(GenerationResult(cut, len(p.ids), n, finish, tokens=tokens,
                                      token_logprobs=out.logprobs[r, :n].tolist(), prompt_ids=p.ids.tolist(),
                                      sample_logprobs=out.sample_logprobs[r, :n].tolist()))
    with self._stats_lock:
      self._stats["sampler_calls"] += 1
      self._stats["rows"] += len(batch)
      self._stats["padded_rows"] += rows - len(batch)
      self._stats["prompt_tokens"] += sum(len(p.ids) for p in batch)
      self._stats["completion_tokens"] += sum(r.completion_tokens for r in results)
      self._stats["sampler_seconds_x1000"] += int(elapsed * 1000)
      self._batch_sizes[len(batch)] += 1
      self._shapes.add(shape)
    return results

  def stats(self) -> dict[str, Any]:
    with self._stats_lock:
      out = {k: int(v) for k, v in self._stats.items() if k != "sampler_seconds_x1000"}
      for key in ("requests", "sampler_calls", "rows", "padded_rows", "prompt_tokens", "completion_tokens"):
        out.setdefault(key, 0)
      out["sampler_seconds"] = self._stats["sampler_seconds_x1000"] / 1000
      out["batch_sizes"] = {str(k): v for k, v in sorted(self._batch_sizes.items())}
      out["distinct_shapes"] = len(self._shapes)
    return out
