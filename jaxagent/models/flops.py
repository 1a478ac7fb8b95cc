"""Analytic FLOPs of our models (maxtext's `calculate_tflops_training_per_device`, `reference/jax_stack.md` §3.1).

6 FLOPs per matmul weight per token for forward + backward, plus causal attention 6·S·(heads·head_dim) per token
per layer (QKᵀ and AV, halved for the causal mask). Embedding lookups are not matmuls and are not counted; a tied
output projection is. `train.mfu` divides these by step time and peak.
"""

from __future__ import annotations


def transformer_flops_per_token(matmul_params: int, num_layers: int, attn_dim: int, seq_len: int,
                                training: bool = True) -> float:
  """FLOPs per token of one forward (+ backward if `training`) pass of a causal decoder."""
  mult = 3 if training else 1
  return mult * (2.0 * matmul_params + 2.0 * num_layers * seq_len * attn_dim)


def decoder_flops_per_token(cfg, seq_len: int, training: bool = True) -> float:
  """`transformer_flops_per_token` for a `models.llama.DecoderConfig`."""
  norms = cfg.hidden_size * (2 * cfg.num_layers + 1)
  lookup = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size  # the input table is not a matmul
  return transformer_flops_per_token(cfg.num_params - norms - lookup, cfg.num_layers,
                                     cfg.num_heads * cfg.head_dim, seq_len, training)


def vit_flops_per_image(cfg, training: bool = True) -> float:
  """Forward (+ backward) FLOPs of a `models.vit.ViTConfig` tower on one image (full, non-causal attention)."""
  tokens = cfg.grid**2 + (1 if cfg.class_token else 0)
  w = cfg.width
  per_block = 4 * w * w + 2 * w * cfg.mlp_dim
  matmul = cfg.depth * per_block + 3 * cfg.patch_size**2 * w
  attention = cfg.depth * 2 * tokens * w  # per token: QKᵀ and AV over all `tokens` keys
  return (3 if training else 1) * tokens * (2.0 * matmul + 2.0 * attention)
