"""Fine-tune the config's model on conversation samples: tokenizer → `models.build` → Grain → `train.loop.train`.

Every supervised stage of every recipe trains here (IL, OpenWebVoyager's iterations, Digi-Q's IL actor,
representation model and Best-of-N actor, DigiRL's and WebRL's actors): only the samples, their weights and the
stage config differ. An AutoUI model (`config.model.kind="autoui"`) trains on the same samples encoded for its
encoder and decoder (`data.seq2seq`), its image encoder frozen (`BuiltModel.trainable`). The workdir is
self-contained: `config.json` (the stage's config), `tokenizer/`, an actor's `agent.json` (how it acts,
`agents.spec`), `checkpoints/` (Orbax; a rerun resumes), TensorBoard events and `metrics.jsonl`, so
`pipeline.policy.load(workdir)`, `python -m jaxagent.evaluate --policy workdir` and `python -m jaxagent.serve
--checkpoint workdir` load it as it is.
"""

from __future__ import annotations

import os
from typing import Callable

import jax
import numpy as np
from flax import nnx

from jaxagent import models
from jaxagent.agents import spec as agent_spec
from jaxagent.agents.base import AgentFormat
from jaxagent.data import conversation, packing, pipeline, seq2seq
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.pipeline.stages import write_text
from jaxagent.serving.checkpoint import load_policy
from jaxagent.train import loop
from jaxagent.train.losses import TOKEN_LEVEL, weighted_token_nll
from jaxagent.train.step import LossFn


def _preview(tokenizer, arrays: dict) -> str:
  """A sample's target text with its loss-carrying spans in ⟦ ⟧ (a TensorBoard check of the mask)."""
  n = int(arrays["attention_mask"].sum())
  targets, mask = arrays["targets"][:n], arrays["loss_mask"][:n]
  cuts = np.flatnonzero(np.diff(mask)) + 1
  out = []
  for ids, m in zip(np.split(targets, cuts), np.split(mask, cuts)):
    text = tokenizer.decode(ids.tolist())
    out.append(f"⟦{text}⟧" if m[0] else text)
  return "".join(out)


def _scalars(item: dict, present: set[str]) -> dict:
  """The per-sample scalars (`pipeline.SCALAR_FIELDS`) a batch carries: one batch structure, so a field some
  sample has (`present`) is given to every sample (a weight defaults to 1; the others must be on all)."""
  out = {}
  for key in present:
    if key not in item and key != "weight":
      raise ValueError(f"sample {item.get('id')!r} has no {key!r} while other samples have one")
    out[key] = float(item.get(key, 1.0))
  return out


def _tokenizer_of(init_from: str | None) -> str | None:
  """The tokenizer of the checkpoint at `init_from`, whose embeddings are indexed by it: a training workdir's
  `tokenizer/`, a HF directory's own files; None when it has none (then the config's)."""
  if not init_from or not os.path.isdir(init_from):
    return None
  saved = os.path.join(init_from, "tokenizer")
  if os.path.isdir(saved):
    return saved
  return init_from if any(os.path.exists(os.path.join(init_from, f)) for f in ("tokenizer.json",
                                                                              "tokenizer_config.json")) else None


def finetune(config, workdir: str, items: list[dict], *, agent: AgentFormat | None = None,
             init_from: str | None = None, loss: LossFn = weighted_token_nll, pad_to: int = 32,
             truncate: bool = False) -> str:
  """Trains `config.model` on `items` (conversation samples, each with an optional `weight`) for
  `config.train.steps`; returns the final checkpoint's path.

  A fresh run starts from the policy at `init_from` (a training workdir or a HF directory), with its tokenizer,
  else from `config.model.hf_checkpoint`'s weights, else from random init. Rows are as long as the longest
  sample (rounded up to `pad_to`), not `data.seq_len`, and a text decoder under a token-level loss packs several
  samples into each (`config.data.packing`, `_packs`): a batch is then `train.batch_size` rows of one or more
  samples, and no step pays for padding. A sample longer than
  `data.seq_len` is refused rather than cut, since a cut reply would teach the model unparsable outputs;
  `truncate=True` cuts it at `data.seq_len` instead (plain SFT on given conversations, as Megatron's
  `seq_length` does in OpenWebVoyager's training). `agent`: the format an actor's samples were built with,
  recorded in `agent.json` so that every loader prompts it the same way (none for a model that does not act).
  """
  os.makedirs(workdir, exist_ok=True)
  tokenizer = load_tokenizer(_tokenizer_of(init_from) or config.data.tokenizer or config.model.hf_checkpoint or None,
                             require_image_token=config.model.kind == "vlm")
  if jax.process_index() == 0:
    tokenizer.save_pretrained(os.path.join(workdir, "tokenizer"))
    write_text(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=2))
    if agent is not None:
      agent_spec.write(workdir, agent, getattr(tokenizer, "chat_template", None))
  if not items:
    raise ValueError(f"finetune {workdir}: no training samples")
  present = {key for key in pipeline.SCALAR_FIELDS if any(key in x for x in items)}
  items = [conversation.validate(x) | _scalars(x, present) for x in items]
  built = models.build(config, tokenizer)
  if built.kind == "autoui":  # an encoder-decoder: prompt → encoder, reply → decoder targets (`data.seq2seq`)
    encode = seq2seq.EncodeSeq2Seq.fit(items, tokenizer, built.preprocess, built.image_size,
                                       int(config.data.seq_len), pad_to, truncate)
  else:
    encode = _encode_decoder_only(config, built, tokenizer, items, pad_to, truncate)
  if _packs(config, built, loss):
    rows = pipeline.pack_samples(items, tokenizer, encode.seq_len)
    ds = pipeline.rows_dataset(rows, batch_size=int(config.train.batch_size), seed=int(config.seed))
  else:
    ds = pipeline.il_dataset(items, encode, batch_size=int(config.train.batch_size), seed=int(config.seed))
  pretrained: Callable[[], nnx.Module] | None = built.pretrained
  if init_from:
    pretrained = lambda: loop.on_host(built.adapt(load_policy(init_from).model))  # its adapters merged, ours added

  def on_start(writer, ts):
    del ts
    arrays = encode(items[0])
    if built.kind == "autoui":
      writer.write_texts(0, {"data/first_sample_loss_marked": seq2seq.preview(tokenizer, arrays)})
      writer.write_images(0, {"data/first_sample_images": arrays["images"][None]})
      return
    writer.write_texts(0, {"data/first_sample_loss_marked": _preview(tokenizer, arrays)})
    if "images" in arrays:
      writer.write_images(0, {"data/first_sample_images": arrays["images"][arrays["image_mask"]]})

  return loop.train(config, workdir, model_fn=built.init, loss_fn=loss, dataset=ds,
                    flops_per_token=built.flops_per_token, on_start=on_start,
                    read_options=pipeline.read_options(int(config.data.num_threads)), pretrained=pretrained,
                    wrt=built.trainable)


def _packs(config, built, loss: LossFn) -> bool:
  """Whether this stage trains on packed rows (`config.data.packing`): "auto" packs where that gives the padded
  batches' loss, a text decoder (`model.kind=decoder`) under a token-level loss (`train.losses.TOKEN_LEVEL`);
  "pack" insists and is refused elsewhere; "pad" never packs."""
  value = config.data.get("packing", "auto")  # a config written before the key: auto
  if value not in packing.PACKING:
    raise ValueError(f"config.data.packing={value!r} is not one of {packing.PACKING}; set "
                     "--config.data.packing=auto")
  why_not = (f"model.kind={built.kind!r} is not a text decoder" if built.kind != "decoder" else
             f"this stage's loss ({getattr(loss, '__qualname__', loss)}) reads one sample a row"
             if loss not in TOKEN_LEVEL else None)
  if value == "pack" and why_not:
    raise ValueError(f"config.data.packing='pack' but {why_not}; set --config.data.packing=auto (packs where it "
                     "can) or pad")
  return value != "pad" and why_not is None


def _encode_decoder_only(config, built, tokenizer, items: list[dict], pad_to: int,
                         truncate: bool) -> pipeline.EncodeSample:
  """The decoder-only (VLM / decoder) encoding, its length the longest sample's rounded up to `pad_to`."""
  longest = max(len(conversation.tokenize(it, tokenizer, built.num_image_tokens, built.image_wrap_id)[0])
                for it in items)
  if longest > config.data.seq_len + 1 and not truncate:
    raise ValueError(f"a training sample has {longest} tokens but config.data.seq_len={config.data.seq_len}; "
                     f"raise --config.data.seq_len to at least {longest}")
  seq_len = min(int(config.data.seq_len), -(-(longest - 1) // pad_to) * pad_to)
  return pipeline.EncodeSample(tokenizer, seq_len, built.num_image_tokens, built.preprocess, built.image_size,
                               int(config.data.max_images), built.image_wrap_id)
