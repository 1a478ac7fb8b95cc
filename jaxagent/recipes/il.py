"""Imitation learning (OpenWebVoyager stage 1, `reference/algorithms.md` §2.3–2.5).

Supervised fine-tuning of the policy on teacher conversations: masked next-token cross-entropy on the assistant
turns only (§2.5). `train_il` is the reusable entry point: OpenWebVoyager's optimisation iterations and Digi-Q's
IL actor call it with their own data and workdir.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jaxagent.data import conversation, pipeline, synthetic_conversations
from jaxagent.data.tokenizer import IMAGE_TOKEN, load_tokenizer
from jaxagent.models.llama import DecoderConfig, init_decoder
from jaxagent.models.vit import ImagePreprocessing
from jaxagent.models.vlm import VLMConfig, init_vlm
from jaxagent.train import loop, mfu
from jaxagent.train.losses import masked_cross_entropy


def il_loss(model, batch: dict, rng: jax.Array):
  """Assistant-token cross-entropy (§2.5) and token accuracy; `rng` unused (no dropout)."""
  del rng
  if "images" in batch:
    logits = model(batch["input_ids"], flat_images(batch["images"], batch["image_mask"]),
                   attention_mask=batch["attention_mask"])
  else:
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
  loss, count = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
  hits = (jnp.argmax(logits, -1) == batch["targets"]) * batch["loss_mask"]
  return loss, {"loss_tokens": count, "token_accuracy": hits.sum() / jnp.maximum(count, 1)}


def flat_images(images: jax.Array, image_mask: jax.Array) -> jax.Array:
  """[B, M, S, S, 3] per-sample slots → [B*M, S, S, 3] with the real images first, in order of appearance.

  The VLM writes the n-th image over the n-th image-token block of the batch (row-major) and ignores trailing
  images (`models.vlm`); compacting inside the step keeps per-sample slots in the data, so micro-batches and
  batch sharding split images with their samples.
  """
  b, m = image_mask.shape
  order = jnp.argsort(~image_mask.reshape(b * m), stable=True)
  return images.reshape(b * m, *images.shape[2:])[order]


def _round_up(n: int, k: int = 64) -> int:
  return -(-n // k) * k


def build_model(config, tokenizer):
  """((model_fn, training FLOPs per token, image tokens per image, image preprocessing), pretrained loader or
  None) for `config.model`; with `hf_checkpoint` the model starts from that local HF directory."""
  mcfg, seq_len = config.model, config.data.seq_len
  if mcfg.hf_checkpoint:
    return _hf_model(config)
  dcfg = DecoderConfig.tiny(**{
      **dict(mcfg.decoder), "vocab_size": _round_up(len(tokenizer)),
      "max_position_embeddings": max(seq_len, 512), "pad_token_id": tokenizer.pad_token_id,
      "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id})
  if mcfg.kind == "decoder":
    return ((lambda: init_decoder(dcfg, int(config.seed))), mfu.decoder_flops_per_token(dcfg, seq_len), 1,
            None), None
  if mcfg.kind == "vlm":
    vcfg = VLMConfig.tiny(dcfg.vocab_size, tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                          vision={"image_size": config.data.image_size, **mcfg.vision},
                          text=dataclasses.asdict(dcfg))
    flops = _vlm_flops(vcfg, config)
    preprocess = ImagePreprocessing.for_tower(vcfg.vision, pad_to_square=True)
    return ((lambda: init_vlm(vcfg, int(config.seed))), flops, vcfg.num_image_tokens, preprocess), None
  raise ValueError(f"config.model.kind={mcfg.kind!r}; use 'decoder' or 'vlm'")


def _hf_model(config):
  """`build_model` for `config.model.hf_checkpoint`: architecture from its config.json, weights loaded
  (straight into their shardings) only when a fresh run starts."""
  from jaxagent.models.hf import llama as hf_llama, llava as hf_llava  # pylint: disable=g-import-not-at-top
  from jaxagent import sharding  # pylint: disable=g-import-not-at-top
  path, seq_len = config.model.hf_checkpoint, config.data.seq_len
  mesh = sharding.make_mesh(dict(config.mesh))
  if config.model.kind == "decoder":
    dcfg = DecoderConfig.from_hf(hf_llama.read_config(path))
    load = lambda: hf_llama.load_pretrained(path, mesh)[0]
    return ((lambda: init_decoder(dcfg, 0)), mfu.decoder_flops_per_token(dcfg, seq_len), 1, None), load
  if config.model.kind == "vlm":
    vcfg = hf_llava.config_from_hf(hf_llama.read_config(path))
    load = lambda: hf_llava.load_pretrained(path, mesh)[0]
    return ((lambda: init_vlm(vcfg, 0)), _vlm_flops(vcfg, config), vcfg.num_image_tokens,
            ImagePreprocessing.for_tower(vcfg.vision, pad_to_square=True)), load
  raise ValueError(f"config.model.kind={config.model.kind!r}; use 'decoder' or 'vlm'")


def _vlm_flops(vcfg, config) -> float:
  """Training FLOPs per text token; every sample carries max_images image slots, all run through the tower."""
  e_v, e_t = vcfg.vision.width, vcfg.text.hidden_size
  per_image = mfu.vit_flops_per_image(vcfg.vision) + 6 * vcfg.num_image_tokens * (e_v * e_t + e_t * e_t)
  seq_len = config.data.seq_len
  return mfu.decoder_flops_per_token(vcfg.text, seq_len) + config.data.max_images / seq_len * per_image


def load_items(config, workdir: str) -> list[dict]:
  """The conversations: `config.data.path`, else synthetic ones generated (once) into `<workdir>/data`."""
  path = config.data.path
  if not path:
    path = os.path.join(workdir, "data", "conversations.json")
    if jax.process_index() == 0 and not os.path.exists(path):
      synthetic_conversations.generate(os.path.dirname(path), config.data.synthetic_episodes,
                                       seed=int(config.seed))
    if jax.process_count() > 1:  # the others read what process 0 wrote to the shared workdir
      multihost_utils.sync_global_devices("il_synthetic_data")
  return conversation.load_conversations(path)


def _sample_preview(tokenizer, arrays: dict) -> str:
  """A sample's target text with its loss-carrying spans in ⟦ ⟧ (a TensorBoard check of the mask)."""
  n = int(arrays["attention_mask"].sum())
  targets, mask = arrays["targets"][:n], arrays["loss_mask"][:n]
  cuts = np.flatnonzero(np.diff(mask)) + 1
  out = []
  for ids, m in zip(np.split(targets, cuts), np.split(mask, cuts)):
    text = tokenizer.decode(ids.tolist())
    out.append(f"⟦{text}⟧" if m[0] else text)
  return "".join(out)


def train_il(config, workdir: str, dataset: list[dict] | None = None) -> str:
  """Trains the policy on OWV conversations; returns the final checkpoint path.

  `dataset`: validated conversation dicts (`conversation.load_conversations`); None reads `config.data`.
  The tokenizer is saved to `<workdir>/tokenizer` so the run directory is self-contained.
  """
  os.makedirs(workdir, exist_ok=True)
  tokenizer = load_tokenizer(config.data.tokenizer or config.model.hf_checkpoint or None)
  if jax.process_index() == 0:
    tokenizer.save_pretrained(os.path.join(workdir, "tokenizer"))
  items = [conversation.validate(x) for x in dataset] if dataset is not None else load_items(config, workdir)
  (model_fn, flops_per_token, num_image_tokens, preprocess), pretrained = build_model(config, tokenizer)
  encode = pipeline.EncodeSample(tokenizer, config.data.seq_len, num_image_tokens, preprocess,
                                 preprocess.crop_size or preprocess.size if preprocess else 0,
                                 config.data.max_images)
  ds = pipeline.il_dataset(items, encode, batch_size=config.train.batch_size, seed=int(config.seed))

  def on_start(writer, ts):
    del ts
    arrays = encode(items[0])
    writer.write_texts(0, {"data/first_sample_loss_marked": _sample_preview(tokenizer, arrays)})
    if "images" in arrays:
      writer.write_images(0, {"data/first_sample_images": arrays["images"][arrays["image_mask"]]})

  return loop.train(config, workdir, model_fn=model_fn, loss_fn=il_loss, dataset=ds,
                    flops_per_token=flops_per_token, on_start=on_start,
                    read_options=pipeline.read_options(config.data.num_threads), pretrained=pretrained)


def run(config, workdir: str) -> None:
  path = train_il(config, workdir)
  print(f"IL done: final checkpoint {path}")
