"""Precision and memory from the config: `model.dtype`, `model.param_dtype` and `model.remat` reach every family
through `models.build`, are refused when wrong before any work, keep bfloat16 within a stated tolerance of
float32, and remat lowers what the backward pass keeps and the compiled program's temp bytes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import digirl as digirl_config
from jaxagent import models
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.models import llama
from jaxagent.pipeline.config import ConfigError, validate
from jaxagent.recipes import digirl

# bfloat16 keeps 8 bits of mantissa (~0.4 % per rounding); over the tiny decoder's 2 blocks the logits (|x| < 1
# at init) move by a few thousandths and the next-token NLL by well under 0.1 %.
LOGIT_ATOL, NLL_RTOL = 0.02, 1e-3


def _config(kind: str, **model):
  config = digirl_config.get_config("smoke")
  config.model.kind = kind
  config.model.update(model)
  return config


@pytest.mark.parametrize("kind", ["decoder", "vlm", "autoui"])
def test_every_family_builds_its_parameters_in_the_configured_dtype(kind):
  tokenizer = load_tokenizer(None)
  built = models.build(_config(kind, dtype="bfloat16", param_dtype="bfloat16"), tokenizer)
  params = jax.tree.leaves(nnx.state(nnx.eval_shape(built.init), nnx.Param))
  assert {p.dtype for p in params} == {jnp.dtype(jnp.bfloat16)}
  default = models.build(_config(kind), tokenizer)
  assert {p.dtype for p in jax.tree.leaves(nnx.state(nnx.eval_shape(default.init), nnx.Param))} == {
      jnp.dtype(jnp.float32)}


def test_remat_reaches_both_towers_of_a_vlm():
  model = nnx.eval_shape(models.build(_config("vlm", remat="dots"), load_tokenizer(None)).init)
  assert model.config.text.remat == "dots" and model.config.vision.remat == "dots"


def _nll(logits, ids):
  return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, ids[..., None], -1)[..., 0])


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
@pytest.mark.slow
def test_bfloat16_stays_within_the_stated_tolerance_of_float32(param_dtype):
  ids = jax.random.randint(jax.random.key(1), (4, 64), 0, 256)
  reference = llama.init_decoder(llama.DecoderConfig.tiny(), 0)
  low = llama.init_decoder(llama.DecoderConfig.tiny(dtype="bfloat16", param_dtype=param_dtype), 0)
  nnx.update(low, jax.tree.map(lambda x: x.astype(param_dtype), nnx.state(reference, nnx.Param)))  # same weights
  want, got = reference(ids), low(ids)
  assert np.abs(np.asarray(got, np.float32) - np.asarray(want)).max() <= LOGIT_ATOL
  assert float(_nll(got, ids)) == pytest.approx(float(_nll(want, ids)), rel=NLL_RTOL)
  assert np.abs(np.asarray(got, np.float32) - np.asarray(want)).max() > 0  # bfloat16 did run


def _backward(remat: str, num_layers: int = 4, **cfg):
  cfg = llama.DecoderConfig.tiny(num_layers=num_layers, hidden_size=128, head_dim=32, intermediate_size=512,
                                 remat=remat, **cfg)
  graphdef, state = nnx.split(llama.init_decoder(cfg, 0))
  ids = jnp.zeros((2, 256), jnp.int32)

  def loss(state):
    hidden, _ = nnx.merge(graphdef, state).hidden_states(ids)
    return jnp.mean(jnp.square(hidden.astype(jnp.float32)))

  return loss, state


def _kept(loss, state) -> int:
  """Bytes of the residuals the backward pass reads: the leaves of the VJP's closure."""
  _, vjp = jax.vjp(loss, state)
  return sum(x.nbytes for x in jax.tree.leaves(vjp))


def _loops(jaxpr) -> int:
  """Loops (`scan`, `while`) in a jaxpr and every jaxpr inside it: flash attention's forward and backward are one
  each per layer, so a recomputed forward adds one."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name in ("scan", "while")
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", sub)
        count += _loops(inner) if hasattr(inner, "eqns") else 0
  return count


@pytest.mark.slow
def test_remat_keeps_less_for_the_backward_pass_and_lowers_the_compiled_temp_bytes():
  kept = {name: _kept(*_backward(name)) for name in ("none", "dots", "projections", "dots_no_batch", "full")}
  assert kept["none"] > kept["dots"] > kept["projections"] > kept["dots_no_batch"] > kept["full"], kept
  temp = {}
  for name in ("none", "full"):
    loss, state = _backward(name)
    temp[name] = jax.jit(jax.grad(loss)).lower(state).compile().memory_analysis().temp_size_in_bytes
  assert temp["full"] < 0.5 * temp["none"], temp  # 13.8 vs 41.0 MB (layers.remat recomputes late)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_remat_policies_see_products_inside_custom_vjps_and_projections_recompute_no_attention(dtype):
  """bfloat16 products on CPU (`layers.bf16_matmul`) and flash attention are `custom_vjp`s, no `dot_general` to
  JAX's dots policies: each policy still keeps what it names, "projections" keeps flash's output and log-sum-exp
  so that its backward recomputes no attention forward, and every policy gives the same gradients."""
  kept, loops, grads = {}, {}, {}
  for name in ("none", "dots", "projections", "dots_no_batch", "full"):
    loss, state = _backward(name, num_layers=2, dtype=dtype, attention="flash")
    kept[name] = _kept(loss, state)
    loops[name] = _loops(jax.make_jaxpr(jax.grad(loss))(state).jaxpr)
    grads[name] = jax.grad(loss)(state)
  assert kept["none"] > kept["projections"] > kept["dots_no_batch"] > kept["full"], kept
  assert kept["dots"] >= kept["projections"], kept
  # Per layer, flash's forward and backward are two loops each (over query tiles, and over key tiles within).
  assert loops["projections"] == loops["dots"] == loops["none"] == 2 * 4, loops
  assert loops["dots_no_batch"] == loops["full"] == 2 * 6, loops  # and a recomputed forward
  for name, grad in grads.items():
    for got, want in zip(jax.tree.leaves(grad), jax.tree.leaves(grads["none"])):
      np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-5, atol=1e-7,
                                 err_msg=name)


@pytest.mark.parametrize("key,value,needle", [
    ("dtype", "bf16", r"config\.model\.dtype='bf16' is not one of \('float32', 'bfloat16', 'float16'\)"),
    ("param_dtype", "float64", r"config\.model\.param_dtype='float64'"),
    ("remat", "yes",
     r"config\.model\.remat='yes' is not one of \('none', 'full', 'dots', 'dots_no_batch', 'projections'\)"),
])
def test_a_bad_precision_value_is_refused_before_any_work_naming_the_key(key, value, needle):
  config = _config("vlm")
  config.model[key] = value
  with pytest.raises(ConfigError, match=needle):
    validate(config, digirl.CHOICES, {})


def test_autoui_refuses_remat_naming_the_key():
  with pytest.raises(ConfigError, match=r"config\.model\.remat='full': AutoUI's T5 has no rematerialisation"):
    validate(_config("autoui", remat="full"), digirl.CHOICES, {})
