"""MFU accounting: analytic FLOPs agree with the real parameter count; the measured peak is cached and sane."""

import jax
import numpy as np
from flax import nnx

from jaxagent.models.llama import DecoderConfig, init_decoder
from jaxagent.models.vit import ViTConfig
from jaxagent.train import mfu


def test_decoder_flops_count_every_matmul_weight_once():
  for tied in (False, True):
    cfg = DecoderConfig.tiny(vocab_size=96, tie_word_embeddings=tied)
    params = nnx.state(init_decoder(cfg), nnx.Param)
    sizes = {jax.tree_util.keystr(k): np.size(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}
    assert sum(sizes.values()) == cfg.num_params
    matmul = sum(s for k, s in sizes.items() if "norm" not in k and ("embed" not in k or tied))
    seq = 64
    attention = 6 * cfg.num_layers * seq * cfg.num_heads * cfg.head_dim
    assert mfu.decoder_flops_per_token(cfg, seq) == 6 * matmul + attention


def test_vit_flops_scale_with_tokens_and_depth():
  small = ViTConfig.tiny()
  deeper = ViTConfig.tiny(depth=small.depth * 2)
  patch = 3 * small.patch_size**2 * small.width
  tokens = small.grid**2 + 1
  assert mfu.vit_flops_per_image(deeper) - mfu.vit_flops_per_image(small) == (
      mfu.vit_flops_per_image(small) - 6 * tokens * patch)


def test_measured_peak_is_cached_per_process():
  rate = mfu.measured_matmul_flops(n=256, repeats=2)
  assert rate > 1e8  # any CPU of this decade does > 0.1 GFLOP/s
  assert mfu.measured_matmul_flops(n=256, repeats=2) is rate
  assert mfu.mfu(2.0 * rate, 2.0, rate) == 1.0


def test_the_processor_is_named_by_its_family_and_model(tmp_path, monkeypatch):
  """Results name the CPU beside every figure: its model name, family and model from /proc/cpuinfo; a machine
  without that file falls back to `platform.processor()`."""
  name = mfu.processor_name()
  assert name and name != "unknown"
  with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
    family = next(line.split(":", 1)[1].strip() for line in f if line.startswith("cpu family"))
  assert f"(family {family}, model " in name
  real_open = open
  monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(tmp_path / "absent", *a, **k)
                      if path == "/proc/cpuinfo" else real_open(path, *a, **k))
  monkeypatch.setattr(mfu.platform, "processor", lambda: "x86_64")
  assert mfu.processor_name() == "x86_64"
