"""Qwen2.5-VL's vision tower against a tiny random `transformers` one: windows, 2-D rotary, merger."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from jaxagent.models import qwen2_vl

VISION = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=40, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, window_size=16, fullatt_block_indexes=[1])


def _load(ref, cfg):
  """Our tower with `ref`'s weights (Linear [out, in] -> [in, out]; the Conv3d to channels-last)."""
  model = qwen2_vl.VisionTower(cfg, rngs=nnx.Rngs(0))
  sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
  params = {"patch_embed": sd["patch_embed.proj.weight"].transpose(1, 2, 3, 4, 0),
            "ln_q.scale": sd["merger.ln_q.weight"]}
  for ours, hf in (("mlp_0", "merger.mlp.0"), ("mlp_2", "merger.mlp.2")):
    params[f"{ours}.kernel"], params[f"{ours}.bias"] = sd[f"{hf}.weight"].T, sd[f"{hf}.bias"]
  for i in range(cfg.depth):
    b = f"blocks.{i}."
    params[b + "norm1.scale"], params[b + "norm2.scale"] = sd[b + "norm1.weight"], sd[b + "norm2.weight"]
    for ours, hf in (("qkv", "attn.qkv"), ("proj", "attn.proj"), ("gate_proj", "mlp.gate_proj"),
                     ("up_proj", "mlp.up_proj"), ("down_proj", "mlp.down_proj")):
      params[f"{b}{ours}.kernel"], params[f"{b}{ours}.bias"] = sd[f"{b}{hf}.weight"].T, sd[f"{b}{hf}.bias"]
  state = nnx.state(model, nnx.Param)
  flat = {".".join(str(k) for k in path): v for path, v in nnx.to_flat_state(state)}
  assert set(flat) == set(params)
  for key, var in flat.items():
    var.set_value(jnp.asarray(params[key]))
  nnx.update(model, state)
  return model


@pytest.mark.slow
def test_tower_matches_transformers_with_windows_and_two_images():
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen2_5_VLConfig(vision_config=VISION).vision_config
  ref = transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VisionTransformerPretrainedModel(hf_cfg).eval()
  with torch.no_grad():
    for p in ref.parameters():
      p.normal_(0.0, 0.2)
  cfg = qwen2_vl.VisionConfig.from_hf(hf_cfg.to_dict())
  # 12x8 patches: 6x4 merged blocks in windows of 2x2 (16 px / 2 / 4), the last row of windows cut; then 4x4.
  grid = np.asarray([[1, 12, 8], [1, 4, 4]])
  patches = np.random.RandomState(0).randn(int((grid[:, 1] * grid[:, 2]).sum()), cfg.patch_dim).astype(np.float32)
  lay = qwen2_vl.layout(cfg, grid)
  assert len(np.unique(lay.window_segments)) > 2  # windows really split the first image
  with torch.no_grad():
    want = ref(torch.from_numpy(patches), grid_thw=torch.from_numpy(grid)).pooler_output.numpy()
  ours = np.asarray(_load(ref, cfg)(jnp.asarray(patches), lay))
  assert ours.shape == want.shape
  assert np.max(np.abs(ours - want)) / np.max(np.abs(want)) < 1e-4
