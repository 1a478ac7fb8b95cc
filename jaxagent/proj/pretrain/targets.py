"""Attention targets: a pre-training loss that names where two heads should look (`configs/pretrain.py`'s
`targets`, a named departure from a plain causal LM; weight 0 turns it off).

A small decoder trained from scratch on this corpus learns the replies' syntax within a few hundred steps but not
the look-up and the copy (docs/results/pretrain.md): those need an attention that finds one token among a page's
hundreds, and a plain LM loss reaches it only through the output. Here the corpus says where each reply's content
comes from (`alignment`), so the loss also asks, with a cross-entropy over the keys:
  * `reply_heads` heads of layer `reply_layer`, at the position that predicts a reply's content token, to attend
    to its source (the quoted string's token; for an id, the last word of that element's text);
  * `link_heads` heads of layer 0, at each word of an element's text, to attend to the element's id token, and at
    each value after an element (a listing's price, rating, reviews) to the element's last word: what makes the id
    readable where the reply's head looks, and a value findable by its element's name;
  * `name_heads` heads of layer `name_layer`, at the position that predicts a looked-up id or value, to attend to
    the last word of the name the latest instruction quotes: they bring the name to the reply, however far back
    the instruction is (a WebRL prompt puts it before the page), for the reply's heads to match on the page;
  * `previous_heads` heads of layer 0 (after the link heads' key-value heads), at every token, to attend to the
    token before it: what lets a later head find the token that follows one it has just copied (an induction
    head), where a copy otherwise repeats a token or stops short;
  * `span_heads` heads of layer 0, at the last token of a name (an element's text on the page; a name a note or
    instruction writes out), to attend evenly to the name's tokens: the name's summary where the look-up matches,
    as sibling products share a name's last token (` F`, `49` / ` M`, `49`);
  * `pointer` (with a copy head, `model.decoder.copy_head`): the head's pointer, at the position that predicts a
    reply's content token, to point at its source where the source is that same token (a string's, not an id's);
  * with `readout`, those heads' output alone to name the token they attend to (a cross-entropy through the final
    norm and the unembedding; the previous heads' at every `previous_readout_every`-th token, for the budget), and
    with `copy_init` their value and output projections start as a copy.
The architecture stays a Llama decoder (with a copy head only if the config adds one): the base exports and loads
as any other.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.data import packing
from jaxagent.models import layers
from jaxagent.proj.pretrain import alignment
from jaxagent.train.losses import first_positions, sparse_nll_of_hidden

FIELDS = ("reply_source", "link_source", "name_source", "span_source")


def id_links(ids: Sequence[int], pieces: Sequence[str]) -> np.ndarray:
  """links[k] = k - j at each word k of an element's text, j its id token (`<a id="j"> words </a>`); else 0."""
  ids = [int(t) for t in ids]
  links = np.zeros(len(ids), np.int32)
  for j in range(1, len(ids) - 1):
    if not (pieces[ids[j - 1]].endswith('id="') and pieces[ids[j + 1]].startswith('"')):
      continue
    for k in range(j + 2, len(ids)):
      if pieces[ids[k]].lstrip().startswith("<"):
        break
      if any(ch.isalnum() for ch in pieces[ids[k]]):
        links[k] = k - j
  return links


def element_spans(links: np.ndarray) -> np.ndarray:
  """spans[k] = L at the last word k of each element's text of two or more tokens (`<a id="j"> w1 … wn </a>`:
  its tokens k-L+1..k, first word to last); else 0. `links`: `id_links`' output."""
  words: dict[int, list[int]] = {}  # the id token -> its element's words
  for k in np.flatnonzero(links):
    words.setdefault(int(k - links[k]), []).append(int(k))
  spans = np.zeros(len(links), np.int32)
  for ks in words.values():
    if ks[-1] > ks[0]:
      spans[ks[-1]] = ks[-1] - ks[0] + 1
  return spans


def target_rows(encoded, pieces: Sequence[str], seq_len: int) -> dict[str, np.ndarray]:
  """The attention targets of the samples `encoded` ((ids, loss flags) each), in the rows `data.packing.pack`
  puts them in (it places samples by their lengths alone, so a second pack lines up with the first); `pieces[t]`
  is token t's text."""
  fields = {f: [] for f in FIELDS}
  for ids, loss in encoded:
    align, named, spans = alignment.alignment(ids, loss, pieces)
    to_id = id_links(ids, pieces)
    links = np.where(to_id > 0, to_id, alignment.value_links(ids, pieces))
    spans = np.maximum(spans, element_spans(to_id))
    for field, values in (("reply_source", align), ("name_source", named), ("link_source", as_loss_flags(links)),
                          ("span_source", as_loss_flags(spans))):
      fields[field].append((ids, values))
  return {f: packing.pack(samples, seq_len)["loss_mask"] for f, samples in fields.items()}


def as_loss_flags(per_position: np.ndarray) -> np.ndarray:
  """A per-input-position array in `data.packing.pack`'s loss-flag layout (flags are read one token ahead)."""
  return np.concatenate([[0], per_position[:-1]]).astype(np.int32)


def _queries(offsets, shift: int, most: int, segment_ids):
  """The (at most `most` a row) queries a target scores, first in order: their slots [B, M], offsets (0: none),
  sources (slot + shift - offset) and the keys each may attend to [B, M, T] (causal, its own segment)."""
  at = first_positions(offsets > 0, most)
  off = jnp.take_along_axis(offsets, at, 1)
  slots = jnp.arange(offsets.shape[1])
  q_segment = jnp.take_along_axis(segment_ids, at, 1)
  allowed = (slots[None, None, :] <= at[:, :, None]) & (segment_ids[:, None, :] == q_segment[:, :, None])
  return at, off, at + shift - off, allowed


def head_nll(model, x, layer: int, heads: int, offsets, shift: int, most: int, segment_ids, input_ids=None,
             readout: bool = False, first: int = 0, readout_every: int = 1, span: bool = False):
  """Mean -log attention of query heads `first` .. `first + heads - 1` of `layer` (input `x`) on their target
  keys (with `span`, the mean over the `offsets` keys ending at the query itself: attention spread evenly over a
  name's tokens); with `readout`, plus the cross-entropy of the source's token under those heads' output alone
  (through the final norm and the unembedding) at every `readout_every`-th query: the heads must write what they
  read.

  `offsets` [B, T]: where nonzero, the query at slot t should attend to slot t + shift - offsets: `shift` 1 for
  offsets counted from the token the query predicts (`alignment`), 0 from the query itself. At most `most`
  queries a row."""
  cfg, block = model.config, model.layers[layer]
  positions = layers.segment_positions(segment_ids)
  inv_freq = layers.rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
  h = block.input_layernorm(x)
  at, off, source, allowed = _queries(offsets, shift, most, segment_ids)
  has = off > 0
  take = lambda a: jnp.take_along_axis(a, jnp.clip(at, 0).reshape(at.shape + (1,) * (a.ndim - 2)), 1)
  chosen = np.arange(first, first + heads)
  q = layers.apply_rope(block.self_attn.q_proj(take(h)), take(positions), inv_freq)[:, :, chosen]  # [B, M, h, D]
  k = layers.apply_rope(block.self_attn.k_proj(h), positions, inv_freq)
  k = k[:, :, chosen // (cfg.num_heads // cfg.num_kv_heads)]  # [B, T, h, D]
  scores = jnp.einsum("bmhd,bthd->bhmt", q, k).astype(jnp.float32) / np.sqrt(cfg.head_dim)
  slots = jnp.arange(x.shape[1])
  logp = jax.nn.log_softmax(jnp.where(allowed[:, None], scores, -1e9), -1)
  if span:
    keys = slots[None, None, :]
    in_span = (keys > (at - off)[:, :, None]) & (keys <= at[:, :, None])  # [B, M, T]
    picked = (logp * in_span[:, None]).sum(-1) / jnp.maximum(off, 1)[:, None]  # [B, h, M]
  else:
    picked = jnp.take_along_axis(logp, jnp.clip(source, 0)[:, None, :, None], -1)[..., 0]  # [B, h, M]
  nll = -(picked * has[:, None]).sum() / jnp.maximum(has.sum() * heads, 1)
  if not readout or span:
    return nll
  group = cfg.num_heads // cfg.num_kv_heads
  v = block.self_attn.v_proj(h)[:, :, chosen // group]  # [B, T, h, D]
  every = slice(None, None, readout_every)  # the readout's unembedding is [queries x vocabulary]
  logp, source, has = logp[:, :, every], source[:, every], has[:, every]
  read = jnp.einsum("bhmt,bthd->bmhd", jnp.exp(logp).astype(v.dtype), v)
  out = jnp.einsum("bmhd,hde->bme", read, block.self_attn.o_proj.kernel.get_value()[chosen].astype(v.dtype))
  logp_token = jax.nn.log_softmax(model.logits(model.norm(out)), -1)
  token = jnp.take_along_axis(input_ids, jnp.clip(source, 0), 1)
  ce = -jnp.take_along_axis(logp_token, token[..., None], -1)[..., 0]
  return nll + (ce * has).sum() / jnp.maximum(has.sum(), 1)


def pointer_nll(model, hidden, offsets, most: int, segment_ids, input_ids, targets):
  """Mean -log weight of the copy head's pointer (over every key, not only its top K) on the source of each reply
  token whose source holds that token; `offsets` as `head_nll`'s with shift 1, at most `most` queries a row."""
  plain = model.features(hidden)
  at, off, source, allowed = _queries(offsets, 1, most, segment_ids)
  source = jnp.clip(source, 0)
  has = (off > 0) & (jnp.take_along_axis(input_ids, source, 1) == jnp.take_along_axis(targets, at, 1))
  head = model.copy_head
  scores = head.scores(jnp.take_along_axis(plain, at[..., None], 1), head.key(plain), allowed, segment_ids > 0,
                       layers.segment_positions(segment_ids))
  picked = jnp.take_along_axis(jax.nn.log_softmax(scores, -1), source[..., None], -1)[..., 0]
  return -(picked * has).sum() / jnp.maximum(has.sum(), 1)


def gate_nll(model, hidden, batch: dict, max_tokens: int):
  """Mean binary cross-entropy of the copy head's gate at the reply's loss positions (the first `max_tokens` a row,
  as `sparse_nll_of_hidden` takes them): the pointer where the reply token's source (`reply_source`) holds that same
  token (a copied string's tokens), the vocabulary elsewhere (the reply's syntax, ids, a string's closing quote):
  what ends a copy is the gate handing the next token back to the vocabulary."""
  ids, offsets, mask = batch["input_ids"], batch["reply_source"], batch["loss_mask"].astype(jnp.int32)
  source = jnp.clip(jnp.arange(ids.shape[1])[None, :] + 1 - offsets, 0)
  copy = (offsets > 0) & (jnp.take_along_axis(ids, source, 1) == batch["targets"])
  at = first_positions(mask, max_tokens)
  take = lambda x: jnp.take_along_axis(x, at, 1)
  gate, m = take(hidden[..., model.config.hidden_size]), take(mask)
  bce = -jnp.where(take(copy), jax.nn.log_sigmoid(-gate), jax.nn.log_sigmoid(gate))
  return (bce * m).sum() / jnp.maximum(m.sum(), 1)


def pretrain_loss(max_tokens: int, config, most: dict[str, int]):
  """The reply-token NLL (`losses.sparse_token_nll`) plus `config.weight` × the heads' target NLLs; `most[field]`:
  the most targets of `field` in a row."""
  weight = float(config.weight)
  # (field, layer, heads, shift): shift 1 where the target sits at the token the query predicts (`alignment`)
  terms = (("reply_source", int(config.reply_layer), int(config.reply_heads), 1),
           ("link_source", 0, int(config.link_heads), 0),
           ("name_source", int(config.name_layer), int(config.name_heads), 1))

  previous, every, spans = int(config.previous_heads), int(config.previous_readout_every), int(config.span_heads)
  pointer, gate = float(config.get("pointer", 0.0)), float(config.get("gate", 0.0))
  scale = {"pointer_attention": pointer, "gate_choice": gate}

  def loss_fn(model, batch: dict, rng=None):
    del rng
    xs: list = []
    hidden, _ = model.hidden_states(batch["input_ids"], segment_ids=batch["segment_ids"], layer_inputs=xs)
    loss, metrics = sparse_nll_of_hidden(model, hidden, batch, max_tokens)
    seg, ids, readout = batch["segment_ids"], batch["input_ids"], bool(config.readout)
    parts = {}
    for field, layer, heads, shift in terms:
      parts[field.replace("_source", "_attention")] = (
          head_nll(model, xs[layer], layer % len(xs), heads, batch[field], shift, most[field], seg, ids, readout)
          if heads else jnp.zeros(()))
    if previous:  # every token of a sample but its first: the token before it
      after = jnp.concatenate([jnp.zeros_like(seg[:, :1]), (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)], 1)
      parts["previous_attention"] = head_nll(model, xs[0], 0, previous, after.astype(jnp.int32), 0, seg.shape[1],
                                             seg, ids, readout, first=previous_first(model.config, config),
                                             readout_every=every)
    if pointer and model.copy_head is not None:
      parts["pointer_attention"] = pointer_nll(model, hidden, batch["reply_source"], most["reply_source"], seg, ids,
                                               batch["targets"])
    if gate and model.copy_head is not None:
      parts["gate_choice"] = gate_nll(model, hidden, batch, max_tokens)
    if spans:  # at a name's last token (on the page, and where a note or instruction writes it out): its tokens
      parts["span_attention"] = head_nll(model, xs[0], 0, spans, batch["span_source"], 0, most["span_source"], seg,
                                         first=span_first(model.config, config), span=True)
    total = sum(v * scale.get(k, 1.0) for k, v in parts.items())
    return loss + weight * total, {**metrics, "reply_nll": loss, **parts}

  return loss_fn


def previous_first(decoder_config, config) -> int:
  """The first query head of layer 0 the previous-token heads use: past the link heads' key-value heads, so that
  neither shares the other's keys."""
  return _past_kv_group(decoder_config, int(config.link_heads))


def span_first(decoder_config, config) -> int:
  """The first query head of layer 0 the span heads use: past the link and previous heads' key-value heads."""
  return _past_kv_group(decoder_config, previous_first(decoder_config, config) + int(config.previous_heads))


def _past_kv_group(decoder_config, heads: int) -> int:
  group = decoder_config.num_heads // decoder_config.num_kv_heads
  return -(-heads // group) * group


def check_layer0_heads(decoder_config, config) -> None:
  """The previous-token and span heads fit in layer 0 beside the link heads' key-value heads, each past the
  others' keys; the previous heads' readout stride is >= 1."""
  if int(config.previous_readout_every) < 1:
    raise ValueError(f"config.targets.previous_readout_every={config.previous_readout_every}: the readout at every "
                     "k-th token takes k >= 1 (1: every token); --config.targets.readout=False turns it off")
  for key, first in (("previous_heads", previous_first(decoder_config, config)),
                     ("span_heads", span_first(decoder_config, config))):
    if int(config[key]) and first + int(config[key]) > int(decoder_config.num_heads):
      raise ValueError(f"config.targets.{key}={config[key]}: layer 0 has {decoder_config.num_heads} heads and the "
                       f"link{' and previous' if key == 'span_heads' else ''} heads' keys take the first {first}; "
                       f"lower it or those")


def copy_heads(model, layer: int, heads: int, scale: float, seed: int = 0):
  """`model` with the value and output projections of the first `heads` query heads of `layer` set to copy:
  W_O W_V = `scale` × the projection onto one orthonormal basis a key-value head (`targets.copy_init`), so that a
  head that attends to a token writes that token's own direction. Only its attention is left to learn."""
  cfg, attn = model.config, model.layers[layer].self_attn
  group = cfg.num_heads // cfg.num_kv_heads
  v, o = attn.v_proj.kernel.get_value(), attn.o_proj.kernel.get_value()  # [E, K, D], [H, D, E]
  keys = jax.random.split(jax.random.key(seed), cfg.num_kv_heads)
  for kv in sorted({h // group for h in range(heads)}):
    basis, _ = jnp.linalg.qr(jax.random.normal(keys[kv], (cfg.hidden_size, cfg.head_dim), jnp.float32))
    v = v.at[:, kv, :].set(basis.astype(v.dtype))
    for h in range(kv * group, min((kv + 1) * group, heads)):
      o = o.at[h].set((scale * basis.T).astype(o.dtype))
  attn.v_proj.kernel.set_value(v)
  attn.o_proj.kernel.set_value(o)
  return model
