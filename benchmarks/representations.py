"""Digi-Q representation extraction: (state, action) pairs/s, ours (`proj.digiq.represent.Encoder`,
one jitted forward per batch) vs the same tiny VLM in `transformers` (PyTorch CPU, `LlavaForConditionalGeneration`
loaded from our HF export), measured in the same run.

Both sides get identical inputs: the §5.2 prompt per candidate with the cursor drawn on the 1/4 screenshot
(`proj.digiq.screens.representation_query`), tokenised with image placeholders expanded and preprocessed once, then
batched `--batch` rows at a time; the representation is the last layer's (final-norm) hidden state at the
answer position. Model time only (the host-side query building is shared and reported separately). Each side
is warmed up once (compilation excluded) and timed `--repeats` times, best kept; the max abs difference of the
two sides' representations is reported as the parity check.

  python benchmarks/representations.py --json /tmp/representations.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxagent.proj.digiq import represent  # noqa: E402  pylint: disable=g-import-not-at-top


def _screens(n: int, rng) -> list[np.ndarray]:
  """Phone-sized synthetic screens (412×915): a header bar and a few coloured rows, like the sites' pages."""
  out = []
  for _ in range(n):
    img = np.full((915, 412, 3), 245, np.uint8)
    img[:80] = rng.integers(0, 255, 3)
    for r in range(6):
      y = 120 + r * 120
      img[y:y + 80, 20:392] = rng.integers(100, 255, 3)
    out.append(img)
  return out


def _actions(n: int, rng) -> list[str]:
  out = []
  for _ in range(n):
    y, x = rng.random(2)
    kind = rng.integers(3)
    if kind == 0:
      out.append(f'Action Plan: [DUAL_POINT] ; Action Decision: "action_type": "DUAL_POINT", "touch_point": '
                 f'"[{y:.4f}, {x:.4f}]", "lift_point": "[{y:.4f}, {x:.4f}]", "typed_text": ""')
    elif kind == 1:
      out.append('Action Plan: [TYPE] ; Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, -1.0]", '
                 '"lift_point": "[-1.0, -1.0]", "typed_text": "Best advice for pruning roses"')
    else:
      out.append('Action Plan: [PRESS_BACK] ; Action Decision: "action_type": "PRESS_BACK", "touch_point": '
                 '"[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": ""')
  return out


def _timed(fn):
  t = time.perf_counter()
  out = fn()
  return time.perf_counter() - t, out


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--json", required=True)
  p.add_argument("--pairs", type=int, default=128)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--image_size", type=int, default=64)
  p.add_argument("--repeats", type=int, default=3)
  a = p.parse_args()

  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from jaxagent.proj.digiq import screens as digiq_data  # pylint: disable=g-import-not-at-top
  from jaxagent.models.hf import llava  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.checkpoint import random_policy  # pylint: disable=g-import-not-at-top

  loaded = random_policy("vlm", seed=0, image_size=a.image_size)
  enc = represent.Encoder(loaded, a.batch)
  rng = np.random.default_rng(0)
  screens, actions = _screens(a.pairs, rng), _actions(a.pairs, rng)

  # Shared host side: queries → padded ids and pixels per batch.
  t0 = time.perf_counter()
  batches = []
  for s in range(0, a.pairs, a.batch):
    queries = [digiq_data.representation_query(x, y) for x, y in zip(screens[s:s + a.batch], actions[s:s + a.batch])]
    seqs = [enc._ids(prompt) for _, prompt in queries]  # pylint: disable=protected-access
    width = max(64, 1 << (max(len(q) for q in seqs) - 1).bit_length())
    ids = np.zeros((len(seqs), width), np.int32)
    mask = np.zeros((len(seqs), width), np.int32)
    for r, q in enumerate(seqs):
      ids[r, :len(q)], mask[r, :len(q)] = q, 1
    batches.append((ids, mask, enc._pixels([q for q, _ in queries])))  # pylint: disable=protected-access
  host_s = time.perf_counter() - t0

  def ours():
    return [np.asarray(represent._answer_hidden(loaded.model, i, m, px)) for i, m, px in batches]  # pylint: disable=protected-access

  with tempfile.TemporaryDirectory() as path:
    llava.save_pretrained(loaded.model, loaded.model.config, path)
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()

  def theirs():
    out = []
    with torch.inference_mode():
      for ids, mask, px in batches:
        o = hf(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
               pixel_values=torch.tensor(px).permute(0, 3, 1, 2).contiguous(), output_hidden_states=True)
        h = o.hidden_states[-1].numpy()
        out.append(h[np.arange(len(ids)), mask.sum(-1) - 1])
    return out

  first_s, _ = _timed(ours)
  _timed(theirs)
  ours_t, theirs_t = [], []
  for _ in range(a.repeats):
    t, mine = _timed(ours)
    ours_t.append(t)
    t, ref = _timed(theirs)
    theirs_t.append(t)
  diff = max(float(np.max(np.abs(x - y))) for x, y in zip(mine, ref))
  res = dict(benchmark="representations", pairs=a.pairs, batch=a.batch, image_size=a.image_size,
             ours_pairs_per_s=a.pairs / min(ours_t), transformers_pairs_per_s=a.pairs / min(theirs_t),
             host_query_pairs_per_s=a.pairs / host_s, ours_first_call_s=first_s, max_abs_diff=diff,
             backend=jax.default_backend(), cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(),
             machine=platform.machine(), load_average=os.getloadavg(), jax=jax.__version__,
             torch=torch.__version__, transformers=transformers.__version__)
  res["ratio"] = res["ours_pairs_per_s"] / res["transformers_pairs_per_s"]
  print(f"representation extraction, {a.pairs} pairs in batches of {a.batch}: ours {res['ours_pairs_per_s']:.1f} "
        f"pairs/s, transformers {res['transformers_pairs_per_s']:.1f} pairs/s, ratio {res['ratio']:.2f}x "
        f"(host query building {res['host_query_pairs_per_s']:.1f} pairs/s; max |Δrep| {diff:.2e})")
  os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
  with open(a.json, "w") as f:
    json.dump(res, f, indent=2)
  print(f"wrote {a.json}")


if __name__ == "__main__":
  main()
