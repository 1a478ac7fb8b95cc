"""Token-level losses shared by the supervised recipes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


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


def flat_images(images: jnp.ndarray, image_mask: jnp.ndarray) -> jnp.ndarray:
  """[B, M, S, S, 3] per-sample slots → [B*M, S, S, 3] with the real images first, in order of appearance.

  The VLM writes the n-th image over the n-th image-token block of the batch (row-major) and ignores trailing
  images (`models.vlm`); compacting inside the step keeps per-sample slots in the data, so micro-batches and
  batch sharding split images with their samples.
  """
  b, m = image_mask.shape
  order = jnp.argsort(~image_mask.reshape(b * m), stable=True)
  return images.reshape(b * m, *images.shape[2:])[order]


def weighted_token_nll(model, batch: dict, rng=None):
  """Assistant-token NLL normalised per token, and token accuracy; `rng` unused.

  Unweighted samples: `masked_cross_entropy`, OpenWebVoyager's SFT loss (§2.5). Samples with a `weight`:
  −Σ_b w_b Σ_t m_bt log p_bt / Σ_bt m_bt, `rl.losses.bc_nll(normalize="token")` on the model's log-probabilities
  (Digi-Q's / DigiRL's weighted actor regression, §5.5, §4.7).
  """
  del rng
  if "images" in batch:
    logits = model(batch["input_ids"], flat_images(batch["images"], batch["image_mask"]),
                   attention_mask=batch["attention_mask"])
  else:
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
  if "weight" in batch:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    tok = jnp.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
    mask = batch["loss_mask"].astype(jnp.float32)
    count = mask.sum()
    w = batch["weight"].astype(jnp.float32)[:, None]
    loss = -jnp.sum(jnp.where(mask > 0, tok * w, 0.0)) / jnp.maximum(count, 1.0)
  else:
    loss, count = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
  hits = (jnp.argmax(logits, -1) == batch["targets"]) * batch["loss_mask"]
  return loss, {"loss_tokens": count, "token_accuracy": hits.sum() / jnp.maximum(count, 1)}
