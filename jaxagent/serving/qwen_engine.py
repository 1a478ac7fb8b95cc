"""The batch engine for Qwen2.5-VL policies: `Engine`'s requests, buckets and results over M-RoPE prompts.

What differs from a LLaVA-style VLM: the chat template writes each image as `<|vision_start|><|image_pad|>
<|vision_end|>` (rendered from image parts, `conversation.template_image_token`), each `<|image_pad|>` expands to
the fixed `tokens_per_image`, images are patches (`models.qwen_vl.QwenImages`), and the prompt's positions are
M-RoPE ones computed on the host (`rope_index`); decoding then continues from each row's largest position + 1
(the KV cache keeps it), so the shared `models.sampler` runs unchanged behind `_MRoPEPrompt`.
The continuous-batching server does not run Qwen2.5-VL (`serve.build` refuses it).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.data import conversation
from jaxagent.models import qwen_vl
from jaxagent.models import sampler
from jaxagent.serving import engine as base
from jaxagent.serving.checkpoint import LoadedModel


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _MRoPEPrompt:
  """The sampler's model protocol over `qwen2_vl.Qwen2VL`: the prefill (the prompt's embeddings) at its M-RoPE
  `positions` [3, B, T]; decode steps at the next position of each row, as the cache gives it."""
  model: nnx.Module
  positions: jax.Array

  def init_cache(self, batch: int, max_len: int, dtype=None):
    return self.model.init_cache(batch, max_len, dtype)

  def hidden_states(self, input_ids=None, *, inputs_embeds=None, attention_mask=None, cache=None):
    positions = self.positions if inputs_embeds is not None else None
    return self.model.hidden_states(input_ids, inputs_embeds=inputs_embeds, positions=positions,
                                    attention_mask=attention_mask, cache=cache)

  def logits(self, hidden):
    return self.model.logits(hidden)


_embed = nnx.jit(qwen_vl.embed)


def sample(model, input_ids: np.ndarray, prompt_mask: np.ndarray, patches: np.ndarray, images: qwen_vl.QwenImages,
           num_images: int, config: sampler.SamplingConfig, *, rng: jax.Array) -> sampler.SampleOutput:
  """`vlm.sample` for Qwen2.5-VL: prompts [B, T] (image tokens expanded, either padding side) whose image blocks
  belong to the first `num_images` of `patches` [I, g², D] in order; the rest are padding slots."""
  positions = images.batch_positions(input_ids, prompt_mask, num_images)
  embeds = _embed(model, jnp.asarray(input_ids, jnp.int32), jnp.asarray(patches))
  return sampler.sample(_MRoPEPrompt(model, jnp.asarray(positions)), None, prompt_mask, config, rng=rng,
                        prompt_embeds=embeds)


class QwenVLEngine(base.Engine):
  """`Engine` for a Qwen2.5-VL `LoadedModel` (`qwen_vl.is_qwen`): the same requests, bucketing and stats."""

  def __init__(self, policy: LoadedModel, **kwargs):
    if not qwen_vl.is_qwen(policy):
      raise ValueError(f"QwenVLEngine serves Qwen2.5-VL policies; {policy.name} is a {policy.kind} one (use Engine)")
    super().__init__(policy, **kwargs)

  def prepare(self, request: base.GenerationRequest) -> base._Prepared:  # pylint: disable=protected-access
    """Token ids (each image token expanded to `tokens_per_image`) and the images' patches; raises RequestError."""
    if request.max_tokens < 1 or request.max_tokens > self.max_new_tokens:
      raise base.RequestError(f"max_tokens={request.max_tokens} must be in [1, {self.max_new_tokens}]")
    if request.echo:
      raise base.RequestError("echo (prompt logprobs) is not served for Qwen2.5-VL policies")
    if request.temperature < 0 or not 0 < request.top_p <= 1 or request.top_k < 0:
      raise base.RequestError(f"temperature={request.temperature} must be >= 0, top_p={request.top_p} in (0, 1], "
                              f"top_k={request.top_k} >= 0")
    text = self.render(request.prompt)
    if isinstance(request.prompt, str):
      images = list(request.images)
    else:
      images = base._message_images(request.prompt)  # pylint: disable=protected-access
    tok, pre = self.policy.tokenizer, self.policy.preprocess
    ids = np.asarray(tok(text, add_special_tokens=isinstance(request.prompt, str))["input_ids"], np.int32)
    image_id = conversation.image_token_id(tok)
    if int(np.sum(ids == image_id)) != len(images):
      raise base.RequestError(f"the rendered prompt holds {int(np.sum(ids == image_id))} image tokens for "
                              f"{len(images)} images; give image parts (or one image token per image), in order")
    ids = conversation.expand_images(ids, image_id, pre.tokens_per_image)[0].astype(np.int32)
    try:
      patches = pre(images) if images else None
    except (ValueError, OSError, TypeError) as e:
      raise base.RequestError(f"an image cannot be read: {e}") from None
    if len(ids) > self.max_prompt_tokens:
      raise base.RequestError(f"the prompt has {len(ids)} tokens (images expanded) but this engine accepts at most "
                              f"{self.max_prompt_tokens}; shorten the conversation or send fewer images")
    return base._Prepared(request, ids, patches)  # pylint: disable=protected-access

  def _sample(self, batch, ids, mask, config, rng):
    """The M-RoPE sampler over the batch's patches (`sample`), in `Engine`'s padded-batch loop."""
    pre = self.policy.preprocess
    pix = [p.pixels for p in batch if p.pixels is not None]
    n_img = sum(len(x) for x in pix)
    patches = np.zeros((base._pow2(n_img, 1),) + pre.patch_shape, np.float32)  # pylint: disable=protected-access
    if n_img:
      patches[:n_img] = np.concatenate(pix)
    return sample(self.policy.model, ids, mask, patches, pre, n_img, config, rng=rng), len(patches)
