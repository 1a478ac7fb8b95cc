"""Representation fine-tuning and extraction (`reference/algorithms.md` §5.1 steps 5–8, §5.2).

The VLM learns "does this action change the screen" (Yes iff the pixel MSE of the 1/4 screenshots of s and s'
exceeds 30; the cursor drawn at a tap's touch point; the §5.2 prompt per action type), starting from the IL
actor's weights. Then every (state, candidate) is encoded once, in fixed-shape batches, and cached in
`reps.npz`.

The (s, a) representation, `Encoder(readout=...)`:

  * `"generated"` (the default; the original's rule). Read in `DigiRL-agent/digiq`,
    `postprocess_data/vlm_infer/gradio_based/host.py:generate` (called per (Q-image, prompt) by `client.py`,
    launched by that folder's `RUNME.sh`): `model.generate(..., do_sample=temperature > 0,
    temperature=args.temperature, max_new_tokens=args.max_new_tokens, use_cache=True,
    output_hidden_states=True)` on one prompt (batch 1, so no padding), then
    `output_embeddings = [h[-1] for h in out["hidden_states"][1:]]` and `output_rep = mean(output_embeddings)`.
    HF's `hidden_states` holds one entry per generation step: step 0 covers the whole prompt (dropped by
    `[1:]`); step k >= 1 is the single position of the token fed at that step, i.e. generated token g_k. So
    the mean runs over the last layer's (final-norm, as `Decoder.hidden_states`) states at g_1 .. g_{K-1}, K
    = generated tokens: every generated token except the last one, whose state is never computed. Generation
    stops at EOS (kept as g_K) or at max_new_tokens, so **the EOS token's state does not enter**; for the
    answer "Yes</s>" the representation is the state at "Yes" (host.py's comment: "F: First generated token
    (with hidden states), L: Last generated token (no hidden states)"). An answer that is EOS at once leaves
    nothing to average (`torch.stack([])` raises); `client.py:process_step` then stores a zero vector
    (`default_q_rep_out`): we return zeros for such rows too (`answers()["counts"] == 0`).
    Sampling: `RUNME.sh` passes neither `--temperature` nor `--max-new-tokens`, so host.py's defaults hold:
    **sampled at temperature 0.2** (HF multinomial; HF's default `top_k = 50` also applies; a `top_p` from the
    checkpoint's `generation_config.json` would too, which the repository does not show: we use none), and
    max_new_tokens 512, which only matters past a one-word answer plus EOS. Our `max_new_tokens` (config 5) is
    the vLLM script's argparse default (`vllm_based/vllm_infer_batched.py`; that script never passes it to
    `SamplingParams`, whose own default is 16; it samples at temperature 0.2, top_p 1.0, and reads
    `o.outputs[0].hidden_states[1]` from a patched vLLM, vllm-project/vllm PR 7892, whose layout the repository
    does not show). We sample at `temperature` (default 0.2) with top-k 50, the key of each row derived from
    `seed` and the row's own tokens and pixels: the representation of a (state, action) does not depend on
    its batch or row. `temperature=0` is greedy. EOS = the policy's `eos_ids` (the tokenizer's EOS and the
    end-of-turn token, LLaVA-v1's `</s>`).
    Cached decoding: prefill on right-padded rows (decode tokens go to the cache slots after the padded width;
    pad slots stay invalid and each row's RoPE positions continue from its own length, as
    `models/sampler.py:_sample` handles either padding side), then at most
    `max_new_tokens - 1` decode steps with a done mask, stopping early once every row has ended. Shapes are
    fixed (`batch` rows, power-of-two widths), so one compilation per width.
  * `"prompt_last"`: the last layer's state at the last prompt token (whose next-token distribution is the
    Yes/No answer): one forward pass, no sampling.

The prompt is `screens.representation_prompt` (`construct_sft_data.py:make_prompt`, the fine-tuning prompt and
the vLLM path's `get_prompt`). The gradio path's `client.py:make_prompt` differs in two ways we do not copy: no
"\\n" before "Respond only ...", and the cursor question only for taps (DUAL_POINT with touch == lift).

The state's image features are the VLM vision tower's projected patch features, mean-pooled (the seeds use
BLIP-2 features of the screen, §5.3), for s and for s'.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.data import conversation
from jaxagent.models import sampler
from jaxagent.pipeline import device
from jaxagent.proj.digiq import screens as digiq_data

READOUTS = ("generated", "prompt_last")
HF_TOP_K = 50  # transformers' GenerationConfig default, active when host.py samples


@nnx.jit
def _answer_hidden(model, ids, mask, images):
  """prompt_last: [B, E] float32 last-layer states at each right-padded row's last real token."""
  hidden, _ = model.hidden_states(ids, images=images, attention_mask=mask)
  last = jnp.sum(mask, -1) - 1
  return hidden[jnp.arange(hidden.shape[0]), last].astype(jnp.float32)


def _choose(logits, keys, step, temperature, sampled: bool):
  if not sampled:
    return jnp.argmax(logits, -1).astype(jnp.int32)
  cfg = sampler.SamplingConfig(temperature=1.0, top_k=HF_TOP_K)
  filtered = sampler.filter_logits(logits, cfg, temperature)
  step_keys = jax.vmap(lambda k: jax.random.fold_in(k, step))(keys)
  return jax.vmap(jax.random.categorical)(step_keys, filtered).astype(jnp.int32)


@nnx.jit(static_argnames=("max_new_tokens", "eos_ids", "sampled"))
def _generated_hidden(model, ids, mask, images, row_keys, temperature, *, max_new_tokens: int,
                      eos_ids: tuple[int, ...], sampled: bool):
  """generated: (mean last-layer state over the generated tokens but the last [B, E] float32, the generated
  tokens [B, max_new_tokens] (-1 after a row's end), how many states entered each mean [B]).

  ids/mask [B, T] right-padded; row_keys [B] PRNG keys (unused when greedy). Token g_1 comes from the prefill's
  state at the last prompt token; decode step k feeds g_k, whose state enters the mean unless the row already
  ended (some g_j, j <= k, was EOS), and chooses g_{k+1}."""
  b, t = ids.shape
  n = max_new_tokens
  mask = mask.astype(bool)
  eos = jnp.asarray(eos_ids, jnp.int32)
  is_eos = lambda tok: jnp.isin(tok, eos) if eos_ids else jnp.zeros(tok.shape, bool)
  cache = model.init_cache(b, t + n)
  hidden, cache = model.hidden_states(ids, images=images, attention_mask=mask, cache=cache)
  last = jnp.sum(mask, -1) - 1
  token = _choose(model.logits(hidden[jnp.arange(b), last]), row_keys, 0, temperature, sampled)
  tokens = jnp.full((b, n), -1, jnp.int32).at[:, 0].set(token)
  done = is_eos(token)
  total = jnp.zeros((b, hidden.shape[-1]), jnp.float32)
  count = jnp.zeros((b,), jnp.int32)

  def cond(state):
    step, _, _, _, done, _, _ = state
    return (step < n) & ~jnp.all(done)

  def body(state):
    step, token, cache, tokens, done, total, count = state
    hidden, cache = model.hidden_states(token[:, None], attention_mask=~done[:, None], cache=cache)
    h = hidden[:, 0]
    live = ~done
    total = total + jnp.where(live[:, None], h.astype(jnp.float32), 0.0)
    count = count + live.astype(jnp.int32)
    token = _choose(model.logits(h), row_keys, step, temperature, sampled)
    token = jnp.where(done, -1, token)
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, step))
    done = done | is_eos(token)
    return step + 1, token, cache, tokens, done, total, count

  state = (jnp.int32(1), token, cache, tokens, done, total, count)
  _, _, _, tokens, _, total, count = jax.lax.while_loop(cond, body, state)
  rep = jnp.where(count[:, None] > 0, total / jnp.maximum(count, 1)[:, None].astype(jnp.float32), 0.0)
  return rep, tokens, count


def _row_seed(ids: np.ndarray, pixels: np.ndarray) -> int:
  """A 32-bit digest of one row's prompt tokens and pixels: its sampling key, wherever the row sits."""
  h = hashlib.blake2b(digest_size=4)
  h.update(np.ascontiguousarray(ids, np.int32).tobytes())
  h.update(np.ascontiguousarray(pixels, np.float32).tobytes())
  return int.from_bytes(h.digest(), "little")


class Encoder:
  """(state, action) representations and state image features from a loaded VLM policy, in batches of
  `batch` rows padded to power-of-two widths (a handful of compilations).

  `readout`: "generated" (the original's mean over the answer's states, module docstring) | "prompt_last".
  `max_new_tokens`, `temperature` (0 = greedy), `seed`, `eos_ids` (default: the policy's) apply to
  "generated" only."""

  def __init__(self, loaded, batch: int = 32, readout: str = "generated", max_new_tokens: int = 5,
               temperature: float = 0.2, seed: int = 0, eos_ids: Sequence[int] | None = None):
    if readout not in READOUTS:
      raise ValueError(f"Encoder: readout={readout!r} is not one of {READOUTS}")
    if readout == "generated" and int(max_new_tokens) < 2:
      raise ValueError(f"Encoder: readout='generated' averages the states of every generated token but the last, "
                       f"so max_new_tokens={max_new_tokens} leaves none; use >= 2 (the original: 512, stopping at "
                       "EOS; the config: 5)")
    if temperature < 0:
      raise ValueError(f"Encoder: temperature={temperature} must be >= 0 (0 is greedy)")
    self.loaded, self.batch = loaded, int(batch)
    self.readout, self.max_new_tokens = readout, int(max_new_tokens)
    self.temperature, self.seed = float(temperature), int(seed)
    self.eos_ids = tuple(sorted(int(i) for i in (loaded.eos_ids if eos_ids is None else eos_ids)))
    self.tokenizer = loaded.tokenizer
    self.image_id = loaded.image_token_id

  def _ids(self, prompt: str) -> np.ndarray:
    # The prefix of training's render, tokenised as training does (`conversation.tokenize`). (`Engine.training_prompt`
    # drops a textual BOS for a tokenizer that adds one itself, which then needs add_special_tokens=True.)
    text = conversation.generation_prompt([{"from": "human", "value": prompt}], self.tokenizer)
    ids = np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)
    return conversation.expand_images(ids, self.image_id, self.loaded.num_image_tokens,
                                      self.loaded.image_wrap_id)[0].astype(np.int32)

  def pairs(self, screens: Sequence[np.ndarray], actions: Sequence[str]) -> np.ndarray:
    """[len(actions), hidden] for (screens[i] full-resolution, actions[i])."""
    return self.answers(screens, actions)["reps"]

  def answers(self, screens: Sequence[np.ndarray], actions: Sequence[str]) -> dict[str, np.ndarray]:
    """`reps` [M, hidden]; for readout "generated" also the answers' `tokens` [M, max_new_tokens] (-1 after a
    row's end) and `counts` [M] (states averaged; 0: the answer was EOS at once and the rep is zeros)."""
    reps, tokens, counts = [], [], []
    for start in range(0, len(actions), self.batch):
      chunk = list(range(start, min(start + self.batch, len(actions))))
      queries = [digiq_data.representation_query(screens[i], actions[i]) for i in chunk]
      seqs = [self._ids(prompt) for _, prompt in queries]
      width = max(64, 1 << (max(len(s) for s in seqs) - 1).bit_length())
      ids = np.zeros((self.batch, width), np.int32)
      mask = np.zeros((self.batch, width), np.int32)
      rows = self._pixels([q for q, _ in queries])
      pix = np.zeros((self.batch,) + rows.shape[1:], np.float32)
      pix[:len(chunk)] = rows
      for r, s in enumerate(seqs):
        ids[r, :len(s)], mask[r, :len(s)] = s, 1
      for r in range(len(chunk), self.batch):  # padding rows: a copy of row 0 (their output is dropped)
        ids[r], mask[r] = ids[0], mask[0]
      if self.readout == "prompt_last":
        reps.append(np.asarray(_answer_hidden(self.loaded.model, ids, mask, pix))[:len(chunk)])
        continue
      seeds = [_row_seed(s, p) for s, p in zip(seqs, rows)]
      seeds += [seeds[0]] * (self.batch - len(chunk))
      base = jax.random.key(self.seed)
      keys = jax.vmap(lambda h: jax.random.fold_in(base, h))(jnp.asarray(seeds, jnp.uint32))
      rep, tok, count = _generated_hidden(self.loaded.model, ids, mask, pix, keys, jnp.float32(self.temperature),
                                          max_new_tokens=self.max_new_tokens, eos_ids=self.eos_ids,
                                          sampled=self.temperature > 0)
      reps.append(np.asarray(rep)[:len(chunk)])
      tokens.append(np.asarray(tok)[:len(chunk)])
      counts.append(np.asarray(count)[:len(chunk)])
    out = {"reps": np.concatenate(reps) if reps else np.zeros((0, self.dim), np.float32)}
    if self.readout == "generated":
      out["tokens"] = np.concatenate(tokens) if tokens else np.zeros((0, self.max_new_tokens), np.int32)
      out["counts"] = np.concatenate(counts) if counts else np.zeros((0,), np.int32)
    return out

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

