"""Imitation learning on OpenWebVoyager-format conversations (`reference/algorithms.md` §2.2–2.5).

Default: a tiny VLM (built here, random init) and the byte-level tokenizer trained here, on synthetic
conversations generated into the workdir; a few minutes on a 2-core CPU. `--config.data.path=FILE.json[l]`
trains on real demonstrations instead (e.g. the scripted expert's on the bundled sites).

Variants (`configs/il.py:<name>`):
  smoke  a few steps of a smaller model on a handful of samples (tests, CI).
  text   the same recipe on the text-only decoder (image placeholders become plain tokens).
  owv    OpenWebVoyager's IL stage at paper scale (§2.5: lr 1e-5 → 1e-6 cosine, warmup 9, 300 iterations of
         global batch 64, seq 8192, clip 1.0, Adam β=(0.9, 0.999), no weight decay) from a local HF checkpoint
         (`--config.model.hf_checkpoint=DIR`); needs accelerators.

`--config.model.hf_checkpoint=DIR` also takes a Qwen2.5-VL directory, at a fixed resolution: every image resized to
`data.image_size` rounded to a multiple of patch × merge (28 px), `(side / 28)²` tokens (`models/qwen_vl.py`).
"""

from __future__ import annotations

import ml_collections

from jaxagent import config_lib

VARIANTS = ("smoke", "text", "owv")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant="")
  c = config_lib.base_config()
  c.recipe = "il"

  c.model = config_lib.vlm_model()

  c.data = ml_collections.ConfigDict()
  c.data.path = ""  # OWV JSON/JSONL; "" = synthetic conversations generated into <workdir>/data
  c.data.synthetic_episodes = 48
  c.data.tokenizer = ""  # "" = the default byte-level BPE built here; else a HF tokenizer directory
  c.data.seq_len = 384
  c.data.image_size = 64  # pixels per side fed to the tower (patch 16: 16 image tokens; Qwen2.5-VL: rounded to 28k)
  c.data.max_images = 3  # OWV keeps ≤3 screenshots per sample (§2.2)
  c.data.num_threads = 2

  c.train.steps = 150
  c.train.batch_size = 8
  c.train.log_every = 10
  c.optim.lr = 3e-3
  c.checkpoint.every = 50

  if arg.variant == "smoke":
    c.model.decoder.update(hidden_size=64, num_layers=1, head_dim=16, intermediate_size=128)
    c.data.synthetic_episodes = 4
    c.data.seq_len = 256
    c.data.image_size = 32
    c.train.steps = 6
    c.train.batch_size = 4
    c.train.log_every = 1
    c.optim.warmup_steps = 1
    c.checkpoint.every = 2
    c.train.progress_bar = False
  elif arg.variant == "text":
    c.model.kind = "decoder"
  elif arg.variant == "owv":
    c.model.hf_checkpoint = ml_collections.config_dict.placeholder(str)  # required: an idefics2/LLaVA directory
    c.data.path = ml_collections.config_dict.placeholder(str)  # required: OWV conversations (JSON/JSONL)
    c.data.seq_len = 8192
    c.data.image_size = 336
    c.train.steps = 300
    c.train.batch_size = 64
    c.train.grad_accum_steps = 8
    c.optim.update(lr=1e-5, warmup_steps=9)  # → 1e-6 cosine, clip 1.0, Adam β (0.9, 0.999): the defaults
    c.checkpoint.every = 100
  elif arg.variant:
    raise ValueError(f"configs/il.py: unknown variant {arg.variant!r}; choose one of {VARIANTS}")
  return c
