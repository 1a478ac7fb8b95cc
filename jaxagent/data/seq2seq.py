"""Conversation samples → AutoUI's encoder-decoder arrays (`config.model.kind="autoui"`).

The same samples the decoder-only VLM trains on (`{"images": [screen], "conversations": [human, gpt]}`, the human
turn `<image>\\n<AutoUI prompt>`), encoded as DigiRL feeds `T5ForMultimodalGeneration`: the human text without its
`<image>` marker is the encoder's input, the screenshot goes to the frozen image encoder as pixels, and the reply
is the decoder's target under teacher forcing. As HF's T5 tokenizer does, both texts end with EOS, and the decoder
input is the target shifted right behind the decoder start token (T5's pad id). Acting
(`serving.seq2seq_engine`) encodes its prompts the same way (`encoder_ids`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxagent.data import conversation
from jaxagent.data.pipeline import SCALAR_FIELDS, load_images
from jaxagent.data.tokenizer import IMAGE_TOKEN


def prompt_text(turns: Sequence[dict]) -> str:
  """The human turns' text with the `<image>` markers dropped (the image reaches the model as pixels)."""
  texts = [t["value"].replace(f"{IMAGE_TOKEN}\n", "").replace(IMAGE_TOKEN, "") for t in turns if t["from"] == "human"]
  return "\n".join(texts)


def _with_eos(tokenizer, text: str) -> list[int]:
  return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [int(tokenizer.eos_token_id)]


def encoder_ids(tokenizer, text: str) -> list[int]:
  """The encoder's ids of `text` (a `prompt_text`): its tokens, then EOS, as HF's T5 tokenizer writes them."""
  return _with_eos(tokenizer, text)


def prompt_ids(tokenizer, turns: Sequence[dict]) -> list[int]:
  """The encoder's ids of a conversation's human turns: `prompt_text`, then EOS."""
  return encoder_ids(tokenizer, prompt_text(turns))


def split(item: dict) -> tuple[list[dict], str]:
  """(the human turns, the reply) of a validated sample: one screenshot, human turns, then one gpt turn."""
  turns, sid = item["conversations"], item["id"]
  if len(item["images"]) != 1:
    raise conversation.ConversationError(f"sample {sid!r}: {len(item['images'])} images; AutoUI "
                                         "(config.model.kind=autoui) reads exactly one screenshot per sample")
  if turns[-1]["from"] != "gpt" or any(t["from"] == "gpt" for t in turns[:-1]):
    raise conversation.ConversationError(f"sample {sid!r}: AutoUI (config.model.kind=autoui) trains one reply per "
                                         "sample, the last turn; split multi-turn conversations into samples")
  return turns[:-1], turns[-1]["value"]


@dataclasses.dataclass
class EncodeSeq2Seq:
  """Grain map: one validated sample → fixed-shape arrays.

  `input_ids`/`attention_mask` [prompt_len]; `images` [S, S, 3]; `decoder_ids`, `targets`, `loss_mask`
  [target_len] (`targets` and `loss_mask` are what `train.losses` reads of any batch, so its losses apply as they
  are); plus the sample's scalars (`data.pipeline.SCALAR_FIELDS`). `truncate`: cut a longer prompt or reply (its
  EOS kept) instead of refusing it.
  """
  tokenizer: object
  prompt_len: int
  target_len: int
  preprocess: Callable
  image_size: int
  truncate: bool = False

  @property
  def pad_id(self) -> int:
    return int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)

  def _fit(self, ids: list[int], length: int, what: str, sid) -> list[int]:
    if len(ids) <= length:
      return ids
    if not self.truncate:
      raise conversation.ConversationError(f"sample {sid!r}: its {what} has {len(ids)} tokens, over "
                                           f"{length}; raise --config.data.seq_len")
    return ids[:length - 1] + ids[-1:]

  def ids(self, item: dict) -> tuple[list[int], list[int]]:
    """(encoder ids, target ids) of a sample, both ending in EOS, before padding."""
    turns, reply = split(item)
    return prompt_ids(self.tokenizer, turns), _with_eos(self.tokenizer, reply)

  def __call__(self, item: dict) -> dict:
    prompt, target = self.ids(item)
    prompt = self._fit(prompt, self.prompt_len, "prompt", item["id"])
    target = self._fit(target, self.target_len, "reply", item["id"])
    pad = self.pad_id
    out = {"input_ids": np.full(self.prompt_len, pad, np.int32), "attention_mask": np.zeros(self.prompt_len, np.int32),
           "decoder_ids": np.full(self.target_len, pad, np.int32), "targets": np.full(self.target_len, pad, np.int32),
           "loss_mask": np.zeros(self.target_len, np.int32)}
    out["input_ids"][:len(prompt)] = prompt
    out["attention_mask"][:len(prompt)] = 1
    out["decoder_ids"][1:len(target)] = target[:-1]  # [start = pad] + target shifted right
    out["targets"][:len(target)] = target
    out["loss_mask"][:len(target)] = 1
    out["images"] = np.asarray(load_images(item["images"][:1], self.preprocess)[0], np.float32)
    for key in SCALAR_FIELDS:
      if key in item:
        out[key] = np.float32(item[key])
    return out

  @classmethod
  def fit(cls, items: Sequence[dict], tokenizer, preprocess, image_size: int, seq_len: int, pad_to: int = 32,
          truncate: bool = False) -> "EncodeSeq2Seq":
    """An encoder whose lengths are the longest prompt and reply of `items`, rounded up to `pad_to` and capped at
    `seq_len` (a longer sample is refused, or cut with `truncate`)."""
    probe = cls(tokenizer, seq_len, seq_len, preprocess, image_size, truncate)
    lengths = np.asarray([[len(x) for x in probe.ids(it)] for it in items])
    longest = lengths.max(0)
    if longest.max() > seq_len and not truncate:
      raise ValueError(f"a training sample's prompt or reply has {longest.max()} tokens but config.data.seq_len="
                       f"{seq_len}; raise --config.data.seq_len to at least {longest.max()}")
    prompt_len, target_len = (min(seq_len, -(-int(n) // pad_to) * pad_to) for n in longest)
    return cls(tokenizer, prompt_len, target_len, preprocess, image_size, truncate)


def preview(tokenizer, arrays: dict) -> str:
  """A sample's encoder text, then its loss-carrying target in ⟦ ⟧ (a TensorBoard check of the encoding)."""
  prompt = arrays["input_ids"][arrays["attention_mask"] > 0]
  target = arrays["targets"][arrays["loss_mask"] > 0]
  return f"{tokenizer.decode(prompt.tolist())} → ⟦{tokenizer.decode(target.tolist())}⟧"
