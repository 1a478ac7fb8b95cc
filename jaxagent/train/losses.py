"""Token-level losses shared by the supervised recipes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxagent.models.vlm import flat_images
from jaxagent.rl.losses import bc_nll, webrl_actor_loss_code_seq
from jaxagent.rl import losses as rl_losses


def masked_cross_entropy(logits: jnp.ndarray, targets: jnp.ndarray, mask: jnp.ndarray):
  """Mean next-token cross-entropy over the tokens where `mask` is set.

  OpenWebVoyager's SFT loss (`reference/algorithms.md` §2.5): -Σ_t m_t log p(y_t | y_<t, images) / Σ_t m_t,
  with m_t = 1 on assistant-turn tokens only (image and user tokens never carry loss). `targets` are the inputs
  shifted left by one, so position t predicts token t+1. Computed in float32 whatever the logits' dtype.

  Returns (loss, number of loss tokens).
  """
  logp_loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  mask = mask.astype(jnp.float32)
  count = mask.sum()
  return (logp_loss * mask).sum() / jnp.maximum(count, 1.0), count


def seq2seq_logits(model, batch: dict) -> jnp.ndarray:
  """An encoder-decoder's (AutoUI's, `data.seq2seq`) teacher-forced logits [B, T, V] over `decoder_ids`; the
  batch's `targets` / `loss_mask` are decoder-side, so every loss here reads it as it reads a decoder's."""
  return model(batch["input_ids"], batch["attention_mask"], batch["images"], batch["decoder_ids"])


def _logits(model, batch: dict) -> jnp.ndarray:
  if "decoder_ids" in batch:
    return seq2seq_logits(model, batch)
  if "positions" in batch:  # Qwen2.5-VL: image patches and M-RoPE positions (`models.qwen_vl`)
    from jaxagent.models import qwen_vl  # pylint: disable=g-import-not-at-top
    return qwen_vl.batch_logits(model, batch)
  if "images" in batch:
    return model(batch["input_ids"], flat_images(batch["images"], batch["image_mask"]),
                 attention_mask=batch["attention_mask"])
  if "segment_ids" in batch:  # packed rows (`data.packing`)
    return model(batch["input_ids"], segment_ids=batch["segment_ids"])
  return model(batch["input_ids"], attention_mask=batch["attention_mask"])


def _target_logprobs(model, batch: dict):
  """(logits, log p of each target token [B, T], the float loss mask [B, T])."""
  logits = _logits(model, batch)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  tok = jnp.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
  return logits, tok, batch["loss_mask"].astype(jnp.float32)


def _accuracy(logits, batch: dict, count) -> jnp.ndarray:
  hits = (jnp.argmax(logits, -1) == batch["targets"]) * batch["loss_mask"]
  return hits.sum() / jnp.maximum(count, 1)


def sparse_token_nll(max_tokens: int):
  """`weighted_token_nll` (unweighted) for a decoder whose loss sits on few tokens (a pre-training corpus's
  replies): the vocabulary projection runs at the first `max_tokens` loss positions of each row only, not at every
  position, which at a 4k vocabulary and ~10 % loss tokens is most of the logits' cost."""

  def loss_fn(model, batch: dict, rng=None):
    del rng
    kwargs = ({"segment_ids": batch["segment_ids"]} if "segment_ids" in batch
              else {"attention_mask": batch["attention_mask"]})
    hidden, _ = model.hidden_states(batch["input_ids"], **kwargs)
    return sparse_nll_of_hidden(model, hidden, batch, max_tokens)

  return loss_fn


def first_positions(mask: jnp.ndarray, most: int) -> jnp.ndarray:
  """The slots [B, most] of each row's first `most` nonzero `mask` positions, in order (then zero ones, to fill)."""
  return jnp.argsort(-(mask != 0).astype(jnp.int32), axis=1, stable=True)[:, :most]


def sparse_nll_of_hidden(model, hidden: jnp.ndarray, batch: dict, max_tokens: int):
  """`sparse_token_nll`'s loss and metrics from the decoder's final hidden states (for losses that also read
  the forward pass's insides)."""
  mask = batch["loss_mask"].astype(jnp.int32)
  at = first_positions(mask, max_tokens)  # loss positions first, in order
  take = lambda x: jnp.take_along_axis(x, at, axis=1)
  logits = model.logits(jnp.take_along_axis(hidden, at[..., None], axis=1))
  loss, count = masked_cross_entropy(logits, take(batch["targets"]), take(mask))
  hits = (jnp.argmax(logits, -1) == take(batch["targets"])) * take(mask)
  return loss, {"loss_tokens": count, "token_accuracy": hits.sum() / jnp.maximum(count, 1)}


def weighted_token_nll(model, batch: dict, rng=None):
  """Assistant-token NLL normalised per token, and token accuracy; `rng` unused.

  Unweighted samples: `masked_cross_entropy`, OpenWebVoyager's SFT loss (§2.5). Samples with a `weight`:
  −Σ_b w_b Σ_t m_bt log p_bt / Σ_bt m_bt, `rl.losses.bc_nll(normalize="token")` on the model's log-probabilities
  (Digi-Q's / DigiRL's weighted actor regression, §5.5, §4.7). A sum over tokens, so packed rows (`data.packing`,
  `weight` then [B, T], each token its sample's) give the value of their samples padded one a row.
  """
  del rng
  if "weight" in batch:
    logits, tok, mask = _target_logprobs(model, batch)
    count = mask.sum()
    w = batch["weight"].astype(jnp.float32)
    w = w[:, None] if w.ndim == 1 else w
    loss = -jnp.sum(jnp.where(mask > 0, tok * w, 0.0)) / jnp.maximum(count, 1.0)
  else:
    logits = _logits(model, batch)
    loss, count = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
  return loss, {"loss_tokens": count, "token_accuracy": _accuracy(logits, batch, count)}


# The losses that sum over tokens and normalise by the batch's loss tokens: on packed rows they give what the same
# samples padded one a row give, so `pipeline.finetune` packs for them (`data.packing`); the others (sequence
# log-probabilities, per-sample ratios) read one sample a row.
TOKEN_LEVEL = (weighted_token_nll,)


def sequence_nll(clamp_prob: tuple[float, float] | None = None):
  """The loss −mean_b( w_b · Σ_t m_bt log clip(p_bt, lo, hi) ): a sequence's summed log-probability per sample,
  `rl.losses.bc_nll(normalize="sequence")`. With `clamp_prob=(1e-3, 0.99)` it is DigiRL's and Filtered BC's actor
  loss (§4.7, `digirl/algorithms/digirl/trainer.py:actor_loss`, `get_log_prob`'s clamp); `w_b` is the sample's
  `weight` (1 without one)."""
  def loss_fn(model, batch: dict, rng=None):
    del rng
    logits, tok, mask = _target_logprobs(model, batch)
    loss = bc_nll(tok, mask, batch.get("weight"), clamp_prob=clamp_prob, normalize="sequence")
    count = mask.sum()
    return loss, {"loss_tokens": count, "token_accuracy": _accuracy(logits, batch, count)}

  return loss_fn


def webrl_actor_loss(add_sft_loss: bool = False, normalize: str = "sample"):
  """WebRL's KL-constrained actor loss as the code runs it (`rl.losses.webrl_actor_loss_code`, §3.8;
  `webrl/algorithms/webrl/trainer.py:actor_loss`) on batches whose samples carry their clamped `advantage` and
  the reference policy's summed log-probability of the action `ref_logp` (scored before training); `normalize`:
  the log-ratio over each sample's tokens (the code's batch of one) or the batch's kept tokens."""
  def loss_fn(model, batch: dict, rng=None):
    del rng
    logits, tok, mask = _target_logprobs(model, batch)
    loss, aux = webrl_actor_loss_code_seq(tok, mask, batch["ref_logp"], batch["advantage"], add_sft_loss,
                                          normalize)
    count = mask.sum()
    return loss, {"loss_tokens": count, "token_accuracy": _accuracy(logits, batch, count),
                  "trained_fraction": jnp.mean(aux["mask"]), "mean_beta": jnp.mean(aux["beta"]),
                  "mean_log_ratio": jnp.mean(aux["log_ratio"])}

  return loss_fn


def webrl_actor_loss_paper(beta: float):
  """The paper's KL-constrained regression (β log π_θ(a|s)/π_ref(a|s) − A)² (`rl.losses.webrl_actor_loss_paper`,
  §3.8) on batches carrying `advantage` and `ref_logp`, sequence log-probabilities summed over the reply."""
  def loss_fn(model, batch: dict, rng=None):
    del rng
    logits, tok, mask = _target_logprobs(model, batch)
    lp = jnp.sum(jnp.where(mask > 0, tok, 0.0), -1)
    count = mask.sum()
    loss = rl_losses.webrl_actor_loss_paper(beta, lp, batch["ref_logp"], batch["advantage"])
    return loss, {"loss_tokens": count, "token_accuracy": _accuracy(logits, batch, count)}

  return loss_fn
