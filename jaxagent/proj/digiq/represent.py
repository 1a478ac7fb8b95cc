"""Representation fine-tuning and extraction (`reference/algorithms.md` §5.1 steps 5–8, §5.2).

The VLM learns "does this action change the screen" (Yes iff the pixel MSE of the 1/4 screenshots of s and s'
exceeds 30; the cursor drawn at a tap's touch point; the §5.2 prompt per action type), starting from the IL
actor's weights. Then every (state, candidate) is encoded once, in fixed-shape batches, and cached in
`reps.npz`:

  * the (s, a) representation is the last layer's hidden state at the **answer position** (the last prompt
    token, whose next-token distribution is the Yes/No answer). The seeds average the hidden states of the
    generated answer tokens (§5.2, gradio host); with a one-token answer both read the same position's
    context, and ours needs no sampling, so extraction is one forward pass;
  * the state's image features are the VLM vision tower's projected patch features, mean-pooled (the seeds use
    BLIP-2 features of the screen, §5.3), for s and for s'.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.data import conversation
from jaxagent.pipeline import device
from jaxagent.pipeline.policy import render_prompt
from jaxagent.proj.digiq import screens as digiq_data


@nnx.jit
def _answer_hidden(model, ids, mask, images):
  hidden, _ = model.hidden_states(ids, images=images, attention_mask=mask)
  last = jnp.sum(mask, -1) - 1
  return hidden[jnp.arange(hidden.shape[0]), last].astype(jnp.float32)


class Encoder:
  """(state, action) representations and state image features from a loaded VLM policy, in batches of
  `batch` rows padded to power-of-two widths (a handful of compilations)."""

  def __init__(self, loaded, batch: int = 32):
    self.loaded, self.batch = loaded, int(batch)
    self.tokenizer = loaded.tokenizer
    self.image_id = loaded.image_token_id

  def _ids(self, prompt: str) -> np.ndarray:
    text = render_prompt([{"from": "human", "value": prompt}], self.tokenizer)
    ids = np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)
    return conversation.expand_images(ids, self.image_id, self.loaded.num_image_tokens,
                                      self.loaded.image_wrap_id)[0].astype(np.int32)

  def pairs(self, screens: Sequence[np.ndarray], actions: Sequence[str]) -> np.ndarray:
    """[len(actions), hidden] for (screens[i] full-resolution, actions[i])."""
    out = []
    for start in range(0, len(actions), self.batch):
      chunk = list(range(start, min(start + self.batch, len(actions))))
      queries = [digiq_data.representation_query(screens[i], actions[i]) for i in chunk]
      seqs = [self._ids(prompt) for _, prompt in queries]
      width = max(64, 1 << (max(len(s) for s in seqs) - 1).bit_length())
      ids = np.zeros((self.batch, width), np.int32)
      mask = np.zeros((self.batch, width), np.int32)
      pix = np.zeros((self.batch,) + self._pixels([queries[0][0]]).shape[1:], np.float32)
      pix[:len(chunk)] = self._pixels([q for q, _ in queries])
      for r, s in enumerate(seqs):
        ids[r, :len(s)], mask[r, :len(s)] = s, 1
      for r in range(len(chunk), self.batch):  # padding rows: a copy of row 0 (their output is dropped)
        ids[r], mask[r] = ids[0], mask[0]
      out.append(np.asarray(_answer_hidden(self.loaded.model, ids, mask, pix))[:len(chunk)])
    return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)

  def images(self, screens: Sequence[np.ndarray]) -> np.ndarray:
    """[len(screens), hidden] mean-pooled vision features of the 1/4 screenshots."""
    return device.screen_features(self.loaded, screens, self.batch)

  def _pixels(self, images) -> np.ndarray:
    return np.asarray(self.loaded.preprocess(list(images)), np.float32)

  @property
  def dim(self) -> int:
    return int(self.loaded.model.config.text.hidden_size)


def finetune_items(trajs: Sequence[types.Trajectory], store: TrajectoryStore, out_dir: str) -> list[dict]:
  """The §5.2 Yes/No samples of the dataset steps (`screens.build_representation_dataset`)."""
  path = digiq_data.build_representation_dataset(trajs, store.load_image, out_dir)
  items = conversation.load_conversations(path)
  if not items:
    raise ValueError("representation fine-tuning: no step has both screenshots; was the behaviour data stored?")
  return items


def transitions(trajs: Sequence[types.Trajectory]) -> list[tuple[int, int]]:
  """(trajectory index, step index) of every step with a screenshot and candidates: the critic's rows."""
  return [(i, k) for i, t in enumerate(trajs) for k, s in enumerate(t.steps) if s.image_path and s.candidates]


def extract(encoder: Encoder, trajs: Sequence[types.Trajectory], store: TrajectoryStore) -> dict[str, np.ndarray]:
  """reps [M, N, D] for every row's candidates, image [M, D] of s and next_image [M, D] of s'."""
  rows = transitions(trajs)
  screens, nexts, actions = [], [], []
  for i, k in rows:
    step = trajs[i].steps[k]
    screen = store.load_image(step.image_path)
    screens.append(screen)
    nexts.append(store.load_image(step.next_image_path) if step.next_image_path else screen)
    actions.append(step.candidates)
  n = len(actions[0]) if actions else 0
  flat_screens = [s for s, cands in zip(screens, actions) for _ in cands]
  reps = encoder.pairs(flat_screens, [a for cands in actions for a in cands]).reshape(len(rows), n, -1)
  return {"reps": reps, "image": encoder.images(screens), "next_image": encoder.images(nexts),
          "rows": np.asarray(rows, np.int32).reshape(-1, 2)}

