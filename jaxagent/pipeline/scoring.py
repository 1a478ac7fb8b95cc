"""A trained text model's reading of conversation samples, one forward pass each, no sampling.

For a sample (human turns, then the assistant's reply) `score` returns what WebRL's learners read off a model:
the reply's summed token log-probability and its token count (the actor's log π(a|s), the replay filter's
perplexity), and, at the position where the reply begins (the last token of the prompt as `Engine.training_prompt`
ends it), the logits (the ORM's YES/NO probability) and the final-norm hidden state (the critic's features, the
code's `base_lm(obs)[0][:, -1]`). Rows are sorted by length and padded to power-of-two buckets, so a few shapes
compile whatever the lengths.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.data import conversation

MIN_BUCKET = 128


@nnx.jit
def _forward(model, ids, attention_mask, targets, loss_mask, at):
  logits, hidden = model(ids, attention_mask=attention_mask, return_hidden=True)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  tok = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
  tok = jnp.where(loss_mask > 0, tok, 0.0)
  rows = jnp.arange(ids.shape[0])
  return tok, logits[rows, at].astype(jnp.float32), hidden[rows, at].astype(jnp.float32)


def _bucket(n: int) -> int:
  return max(MIN_BUCKET, 1 << (max(n, 1) - 1).bit_length())


def encode(item: dict, tokenizer) -> tuple[np.ndarray, np.ndarray, int]:
  """(ids, loss mask over ids, position of the reply's first prediction) of one text sample."""
  ids, loss = conversation.tokenize(item, tokenizer, 1)
  first = np.flatnonzero(loss)
  if not len(first) or first[0] == 0:
    raise ValueError(f"sample {item.get('id')!r}: no assistant reply after a prompt to score")
  return ids, loss, int(first[0]) - 1


def score(loaded, items: Sequence[dict], *, batch: int = 8, max_len: int | None = None,
          logit_ids: Sequence[int] | None = None, offset: int = 0, per_token: bool = False) -> dict:
  """For each text sample: `logp` (Σ log p of the reply's tokens), `tokens` (their count), `logits` at the
  reply's start ([N, V], or [N, len(logit_ids)] of those ids) and `hidden` there ([N, D]); `offset` > 0 reads
  the logits that many reply tokens later (past a prefix every reply shares, like the space a template writes
  before it); `per_token=True` adds `token_logp`, each sample's reply tokens' log-probabilities in order (a list
  of arrays), and `reply_ids`, those tokens. `loaded`: a `serving.checkpoint.LoadedModel` of a text decoder. A
  sample longer than `max_len` tokens is cut from the left of its prompt (its reply kept whole)."""
  if loaded.kind != "decoder":
    raise ValueError(f"scoring reads text decoders; {loaded.source or loaded.name} is a {loaded.kind}")
  rows = []
  for item in items:
    ids, loss, at = encode(item, loaded.tokenizer)
    if max_len is not None and len(ids) - 1 > max_len:
      cut = len(ids) - 1 - max_len
      if cut > at:
        raise ValueError(f"sample {item.get('id')!r}: its reply alone exceeds {max_len} tokens")
      ids, loss, at = ids[cut:], loss[cut:], at - cut
    rows.append((ids, loss, at + int(offset)))
  n = len(rows)
  pick = None if logit_ids is None else np.asarray(list(logit_ids), np.int64)
  out = {"logp": np.zeros(n, np.float32), "tokens": np.zeros(n, np.int32)}
  logits_out, hidden_out, token_out, ids_out = [None] * n, [None] * n, [None] * n, [None] * n
  order = sorted(range(n), key=lambda i: len(rows[i][0]))
  pad = loaded.pad_id
  for start in range(0, n, batch):
    chunk = order[start:start + batch]
    length = _bucket(max(len(rows[i][0]) - 1 for i in chunk))
    arrays = {k: np.zeros((batch, length), np.int32) for k in ("ids", "mask", "targets", "loss")}
    arrays["ids"][:] = pad
    at = np.zeros(batch, np.int32)
    for r, i in enumerate(chunk):
      ids, loss, pos = rows[i]
      m = len(ids) - 1
      arrays["ids"][r, :m], arrays["targets"][r, :m] = ids[:-1], ids[1:]
      arrays["mask"][r, :m], arrays["loss"][r, :m] = 1, loss[1:]
      at[r] = pos
    tok, logits, hidden = _forward(loaded.model, jnp.asarray(arrays["ids"]), jnp.asarray(arrays["mask"]),
                                  jnp.asarray(arrays["targets"]), jnp.asarray(arrays["loss"]), jnp.asarray(at))
    tok, logits, hidden = np.asarray(tok), np.asarray(logits), np.asarray(hidden)
    for r, i in enumerate(chunk):
      out["logp"][i] = tok[r].sum()
      if per_token:
        reply = np.flatnonzero(arrays["loss"][r])
        token_out[i], ids_out[i] = tok[r, reply], arrays["targets"][r, reply]
      out["tokens"][i] = int(rows[i][1][1:].sum())
      logits_out[i] = logits[r] if pick is None else logits[r, pick]
      hidden_out[i] = hidden[r]
  out["logits"] = np.stack(logits_out) if n else np.zeros((0, 0), np.float32)
  out["hidden"] = np.stack(hidden_out) if n else np.zeros((0, 0), np.float32)
  if per_token:
    out["token_logp"], out["reply_ids"] = token_out, ids_out
  return out
