"""Conventions shared by every `configs/*.py` file, and the helpers they use.

A config file is a plain Python module that defines

  * `get_config(arg=None) -> ml_collections.ConfigDict`: `arg` is the text after the colon in
    `--config=configs/il.py:arg`. The bare file (`arg` empty or None) is the *embedded default*: it runs on a
    laptop CPU in minutes with no download. `arg` is either a variant name (`configs/il.py:smoke`) or
    `key=value` pairs (`configs/il.py:variant=smoke,steps=10`), parsed by `parse_arg`.
  * `VARIANTS`: a module-level tuple of the variant names `get_config` accepts (the default is implied).
    `tests/test_configs.py` loads every file in `configs/` with `get_config()` and with every name in its
    `VARIANTS`, so a new recipe config is covered by that test as soon as it is added.
  * every config sets `config.recipe` (a name in `jaxagent.recipes.RECIPES`), and the shared blocks below
    (`mesh`, `train`, `optim`, `checkpoint`, `profile`) built by `base_config()`, so every recipe shares
    one training loop (`jaxagent.train.loop`). A recipe with several training stages gives each stage a section
    with its own `train` (steps, batch_size) and `optim` (lr, ...) blocks (`stage(...)`), merged over the
    shared blocks by `jaxagent.pipeline.config.stage_config`; the shared blocks then hold no step count, batch
    size or learning rate of their own (`base_config(staged=True)`), so no key is left unread.
  * a value a variant cannot default (a local checkpoint directory) is `None`: `jaxagent.main` refuses to start
    until it is set (`--config.model.hf_checkpoint=DIR`).

Command-line overrides (`--config.optim.lr=3e-4`) may only set keys that exist; `jaxagent.main` rejects a typo
with the nearest valid key paths, and an enumerated value outside its choices, before any work.
"""

from __future__ import annotations

import ml_collections


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """`"smoke"` or `"variant=smoke,steps=10"` → ConfigDict over `defaults` (big_vision's `parse_arg`).

  A bare word sets `variant`. Values take the type of their default, so `steps=10` is an int.
  """
  out = ml_collections.ConfigDict(dict(defaults))
  if not arg:
    return out
  for part in arg.split(","):
    if not part:
      continue
    key, sep, value = part.partition("=")
    if not sep:
      key, value = "variant", part
    if key not in out:
      raise ValueError(f"config arg {key!r} is not one of {sorted(out.keys())}")
    default = out[key]
    if isinstance(default, bool):
      out[key] = value.lower() in ("1", "true", "yes")
    elif default is not None and not isinstance(default, str):
      out[key] = type(default)(value)
    else:
      out[key] = value
  return out


def base_config(staged: bool = False) -> ml_collections.ConfigDict:
  """Blocks every recipe's training loop reads; recipes override values, never rename keys. `staged`: the
  recipe's stages carry their own steps, batch size and learning rate (`stage`), so the shared blocks do not."""
  c = ml_collections.ConfigDict()
  c.recipe = ""
  c.seed = 0
  c.distributed = False  # call jax.distributed.initialize() (multi-host)
  # Mesh over (data, fsdp, tensor); one axis may be -1 (= the remaining devices).
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
  # Mesh over this process's own devices that rollouts, scoring and evaluation run the policy on
  # (`sharding.local_mesh`): one device by default; fsdp=-1 (or tensor=k) shards a model too large for one.
  c.inference_mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))

  c.train = ml_collections.ConfigDict()
  c.train.steps = 100
  c.train.batch_size = 8  # global batch, per optimizer step
  c.train.grad_accum_steps = 1  # micro-batches per step (batch_size must divide by it)
  c.train.log_every = 10
  c.train.progress_bar = True

  c.optim = ml_collections.ConfigDict()
  c.optim.lr = 1e-3
  c.optim.end_lr_ratio = 0.1  # cosine decays to lr * end_lr_ratio
  c.optim.warmup_steps = 10
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-8
  c.optim.weight_decay = 0.0
  c.optim.clip_norm = 1.0  # 0 disables clipping
  if staged:
    for key in ("steps", "batch_size"):
      del c.train[key]
    del c.optim["lr"]

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 50  # steps; the last step is always saved
  c.checkpoint.keep = 3
  c.checkpoint.async_save = True

  c.profile = ml_collections.ConfigDict()
  c.profile.start_step = -1  # < 0: no trace
  c.profile.num_steps = 3

  # Peak FLOP/s for MFU; 0 = the device's known peak, else the matmul rate measured on this machine.
  c.peak_flops = 0.0
  return c


def vlm_model() -> ml_collections.ConfigDict:
  """`config.model` for the tiny VLM every CPU default trains (IL, Digi-Q, OpenWebVoyager).

  `kind`: "vlm" | "decoder" | "autoui" (DigiRL's / Digi-Q's encoder-decoder actor: T5 sized by `decoder`'s
  hidden_size, num_layers, num_heads, head_dim and intermediate_size, over a frozen ViT sized by `vision`);
  `hf_checkpoint`: a local HF directory to start from (weights + tokenizer), a
  `.gguf` file, or `smollm2` (SmolLM2-135M-Instruct, a real pretrained decoder available offline), "" =
  random init; `base`: the project's own pre-trained base as the start ("pretrain": built once by
  `configs/pretrain.py` and cached; or its export directory; `recipes.pretrain.resolve` sets `hf_checkpoint` to
  it); `hf_family`: the `model_type` the checkpoint must have ("" = any; OWV's paper variant asks for
  idefics2); `decoder` / `vision`: overrides of `DecoderConfig.tiny` / `VLMConfig.tiny` (vocab_size follows the
  tokenizer). `dtype` (compute) and `param_dtype` (storage): float32 | bfloat16 | float16, for every tower of
  every family; `remat`: what each block's backward pass keeps, none | full | dots | dots_no_batch |
  projections (`models.layers.REMAT_POLICIES`: memory for recomputation; projections with attention=flash keeps
  memory linear in the sequence and recomputes no product); `attention`: xla | flash | cudnn, the kernel of
  a Llama-family decoder's training and scoring attention (flash: blockwise, memory linear in the sequence length,
  any backend, for long sequences; cudnn: cuDNN's fused flash attention, GPU and bf16/fp16 only; decoding always
  takes xla). A `:paper` variant's 7-8B model trains in bfloat16
  with remat on an accelerator. `lora`: low-rank adapters (`models.lora`), `rank` 0 = off (full fine-tuning),
  else only the adapters train, scaled by `alpha / rank`, on the comma-separated `targets` (default the language
  decoder's attention and MLP projections; `models.LORA_TARGETS` lists every name); exports merge them in.
  """
  return ml_collections.ConfigDict(dict(
      kind="vlm", hf_checkpoint="", base="", hf_family="", dtype="float32", param_dtype="float32", remat="none",
      attention="xla",
      decoder=ml_collections.ConfigDict(dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                                             head_dim=32, intermediate_size=256)),
      vision=ml_collections.ConfigDict(),
      lora=ml_collections.ConfigDict(dict(rank=0, alpha=16.0,  # `models.DEFAULT_LORA_TARGETS`
                                         targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"))))


def env_block(workers: int) -> ml_collections.ConfigDict:
  """`config.env`, how rollouts run: `workers` browsers; a step or reset slower than its timeout (s) counts as a
  crash; an episode stored `errored` (its browser crashed on every retry) runs again when the rollout resumes,
  at most `errored_retries` more times, and is reported apart from failures."""
  return ml_collections.ConfigDict(dict(
      workers=workers, step_timeout=120.0, reset_timeout=120.0, errored_retries=2,
      # where the workers run: "subprocess" (this machine) | "ray" (Ray actors; "" = a local loopback instance);
      # sites_address: the address the bundled sites are served on ("" = 127.0.0.1; a fleet's machines must reach it)
      backend="subprocess", ray_address="", sites_address="",
      # what renders the bundled sites: "chromium" (the reference) | "text" (no browser: the server's pages
      # simplified in-process, byte for byte Chromium's; simplified-HTML agents only, `envs/sites/text_env.py`)
      browser="chromium"))


def stage(steps: int, batch_size: int, lr: float, **optim) -> ml_collections.ConfigDict:
  """A training stage's section: `train` (steps, batch_size) and `optim` (lr, and any other optimizer value
  this stage sets apart from the shared `optim` block)."""
  return ml_collections.ConfigDict(dict(train=dict(steps=steps, batch_size=batch_size), optim=dict(lr=lr, **optim)))
