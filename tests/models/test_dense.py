"""`layers.Dense` on one row (a decode step at batch 1): the product split over contraction chunks gives the plain
product's values, and it is what the compiled program runs on CPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxagent.models import layers


def _dense(in_shape=(96,), out_shape=(3, 40)):
  return layers.Dense(in_shape, out_shape, in_axes=("embed",), out_axes=("heads", "head_dim"), use_bias=True,
                      rngs=nnx.Rngs(0))


@pytest.mark.parametrize("lead", [(1,), (1, 1), ()])
def test_a_one_row_product_equals_the_plain_product(lead):
  dense = _dense()
  x = jax.random.normal(jax.random.key(1), (*lead, 96))
  kernel = dense.kernel.get_value().reshape(96, 120)
  want = (x.reshape(-1, 96) @ kernel).reshape(*lead, 3, 40) + dense.bias.get_value()
  got = dense(x)
  assert got.shape == (*lead, 3, 40)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _batched_dots(fn, *args) -> int:
  """How many dot_generals with a batch dimension the jaxpr of `fn` holds."""
  jaxpr = jax.make_jaxpr(fn)(*args)
  return sum(1 for eqn in jaxpr.eqns if eqn.primitive.name == "dot_general"
             and eqn.params["dimension_numbers"][1][0])


def test_one_row_goes_through_contraction_chunks_and_several_rows_do_not(monkeypatch):
  dense = _dense()
  one, many = jnp.ones((1, 96)), jnp.ones((4, 96))
  assert _batched_dots(lambda x: dense(x), one) == 1
  assert _batched_dots(lambda x: dense(x), many) == 0
  monkeypatch.setattr(layers, "ROW_SPLIT", 1)  # off
  assert _batched_dots(lambda x: dense(x), one) == 0
  odd = layers.Dense(90, 8, in_axes=("embed",), out_axes=("mlp",), rngs=nnx.Rngs(0))  # 90 % 4: plain product
  monkeypatch.setattr(layers, "ROW_SPLIT", 4)
  assert _batched_dots(lambda x: odd(x), jnp.ones((1, 90))) == 0



@pytest.mark.parametrize("f32_result", [True, False])
def test_bfloat16_products_on_cpu_take_their_operands_as_they_are(monkeypatch, f32_result):
  """A bfloat16 product with a bfloat16 result compiles, on CPU, to both operands converted to float32, a float32
  product and a conversion back; with a float32 result (`CPU_BF16_FLOAT32_RESULT`) the product reads the bfloat16
  operands: no conversion before it. Either way the values are the float32 product's within bfloat16 rounding."""
  monkeypatch.setattr(layers, "CPU_BF16_FLOAT32_RESULT", f32_result)
  dense = layers.Dense(64, 96, in_axes=("embed",), out_axes=("mlp",), dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(2), (8, 64)).astype(jnp.bfloat16)
  text = jax.jit(lambda x: dense(x)).lower(x).compile().as_text()
  before = [line for line in text.splitlines() if "convert" in line and "f32[8,64]" in line.split("=")[0]]
  assert bool(before) == (not f32_result), before
  got = np.asarray(dense(x), np.float32)
  want = np.asarray(x, np.float32) @ np.asarray(dense.kernel.get_value(), np.float32)
  np.testing.assert_allclose(got, want, rtol=0.05, atol=0.02)


@pytest.mark.parametrize("product", ["matmul", "logits_2d"])
@pytest.mark.slow
def test_bfloat16_products_on_cpu_multiply_bfloat16_operands_in_the_backward_too(product):
  """JAX's own backward of a float32-result product multiplies the float32 cotangent by the bfloat16 operands (a
  float32 product on XLA:CPU); `layers.bf16_matmul`'s backward keeps every product's operands bfloat16, and its
  gradients are the float32 product's within bfloat16 rounding: the projections' (`matmul`) and the logits'."""
  dense = layers.Dense(64, 96, in_axes=("embed",), out_axes=("mlp",), dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(3), (16, 64))
  kernel = dense.kernel.get_value()

  def loss(x, kernel, product):
    return jnp.sum(jnp.square(product(x, kernel).astype(jnp.float32)))

  bf16 = lambda x, k: getattr(layers, product)(x.astype(jnp.bfloat16), k.astype(jnp.bfloat16))
  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(x, kernel, bf16)
  dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
  dots += [e for eq in jaxpr.jaxpr.eqns for sub in jax.core.jaxprs_in_params(eq.params) for e in sub.eqns
           if e.primitive.name == "dot_general"]
  assert len(dots) >= 3 and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars), dots
  got = jax.grad(loss, argnums=(0, 1))(x, kernel, bf16)
  want = jax.grad(loss, argnums=(0, 1))(x, kernel, lambda x, k: x @ k)
  for g, w in zip(got, want):
    assert float(jnp.linalg.norm(g - w) / jnp.linalg.norm(w)) < 0.02


def _compiled_products(text: str) -> list[tuple[bool, tuple[str, str]]]:
  """Each product of a compiled CPU program: whether its matmul library runs it (a `__ynn_fusion`) and its
  operands' element types."""
  ynn = set(re.findall(r"calls=%([\w.\-]+),[^\n]*__ynn_fusion", text))
  products, computation, types = [], None, {}
  for line in text.splitlines():
    if header := re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{$", line):
      computation, types = header.group(1), {}
    elif op := re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[", line):
      types[op.group(1)] = op.group(2)
      if dot := re.search(r" dot\(%([\w.\-]+), %([\w.\-]+)\)", line):
        products.append((computation in ynn, (types[dot.group(1)], types[dot.group(2)])))
  return products


@pytest.mark.parametrize("w_transposed", [False, True])
@pytest.mark.parametrize("shape", [(16, 64), (15, 64)])
def test_bfloat16_weight_gradients_on_cpu_run_in_bfloat16(shape, w_transposed):
  """A weight's gradient `x.T @ g` contracts the left operand over its first dimension, and a tied embedding's
  logits `x @ w.T` read a transposed right one: XLA:CPU's matmul library refuses both in bfloat16, which ran as
  float32 products of converted operands, at half the bfloat16 rate. All three products of `bf16_matmul` (forward,
  input and weight gradients) now run in the library on bfloat16 operands, an odd token count included, and the
  gradients stay the float32 ones'."""
  x = jax.random.normal(jax.random.key(4), shape)
  kernel = jax.random.normal(jax.random.key(5), (96, shape[1]) if w_transposed else (shape[1], 96)) / 8

  def loss(x, kernel, product):
    return jnp.sum(jnp.square(product(x, kernel).astype(jnp.float32)))

  bf16 = lambda x, k: layers.bf16_matmul(x.astype(jnp.bfloat16), k.astype(jnp.bfloat16), False, w_transposed)
  grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
  products = _compiled_products(grad.lower(x, kernel, bf16).compile().as_text())
  assert len(products) == 3 and all(ynn and types == ("bf16", "bf16") for ynn, types in products), products
  plain = lambda x, k: x @ (k.T if w_transposed else k)
  for got, want in zip(grad(x, kernel, bf16), jax.grad(loss, argnums=(0, 1))(x, kernel, plain)):
    assert float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want)) < 0.02


@pytest.mark.parametrize("shape", [(6, 4), (5, 4), (6, 3), (5, 3), (2, 3, 6, 4), (2, 3, 5, 4)])
def test_materialized_transpose_swaps_the_last_two_axes(shape):
  x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
  got = layers.materialized_transpose(x)
  if shape[-2:] == (5, 3):
    assert got is None
  else:
    np.testing.assert_array_equal(np.asarray(jax.jit(layers.materialized_transpose)(x)), np.swapaxes(x, -1, -2))
