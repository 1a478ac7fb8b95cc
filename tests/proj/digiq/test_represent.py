"""Digi-Q (state, action) readouts against references computed by hand with the uncached model.

`generated` (the original's rule, `postprocess_data/vlm_infer/gradio_based/host.py`): the mean of the last layer's
states at the generated tokens g_1 .. g_{K-1}, K generated tokens, the last one (EOS) excluded; zeros when g_1 is
EOS. `prompt_last`: the state at the last prompt token.
"""

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.proj.digiq import represent
from jaxagent.proj.digiq import screens as digiq_data
from jaxagent.serving.checkpoint import random_policy

N = 5  # max_new_tokens


def _act(kind, y=-1.0, x=-1.0, text=""):
  return (f'Action Plan: [{kind}] ; Action Decision: "action_type": "{kind}", "touch_point": "[{y}, {x}]", '
          f'"lift_point": "[{y}, {x}]", "typed_text": "{text}"')


# rows of different prompt lengths (a tap, a long TYPE, PRESS_BACK, ...) over two batches of 4 (the second padded)
ACTIONS = [_act("DUAL_POINT", 0.1, 0.5), _act("TYPE", text="best advice for pruning roses in the early spring"),
           _act("PRESS_BACK"), _act("DUAL_POINT", 0.3, 0.7), _act("DUAL_POINT", 0.1, 0.5)]


@pytest.fixture(scope="module")
def policy():
  return random_policy("vlm", seed=0, image_size=32)


@pytest.fixture(scope="module")
def screen():
  img = np.full((915, 412, 3), 240, np.uint8)
  img[100:200] = (30, 90, 200)
  return img


@nnx.jit
def _hidden_states(model, seq, images):
  return model.hidden_states(seq, images=images, attention_mask=jnp.ones(seq.shape, bool))


def _full_hidden(enc, screen, action, generated):
  """Uncached last-layer states [L + len(generated), E] of prompt + generated tokens, and the prompt length L."""
  q_image, prompt = digiq_data.representation_query(screen, action)
  ids = enc._ids(prompt)  # pylint: disable=protected-access
  seq = np.concatenate([ids, np.asarray(generated, np.int32)])[None]
  hidden, _ = _hidden_states(enc.loaded.model, jnp.asarray(seq), jnp.asarray(enc._pixels([q_image])))  # pylint: disable=protected-access
  return np.asarray(hidden[0], np.float32), len(ids)


def _reference(enc, screen, action, tokens, eos_ids, greedy):
  """The original's rule applied to the answer `tokens` (the encoder's; re-derived by argmax when greedy)."""
  answer = []
  for t in tokens:  # the answer: up to and including the first EOS
    if t < 0:
      break
    answer.append(int(t))
    if t in eos_ids:
      break
  hidden, length = _full_hidden(enc, screen, action, answer)
  if greedy:  # each generated token is the argmax after the previous position: decoding is reproduced by hand
    logits = np.asarray(enc.loaded.model.logits(jnp.asarray(hidden[length - 1:length - 1 + len(answer)])))
    assert logits.argmax(-1).tolist() == answer
  # hidden[length + k - 1] is the state at g_k; g_1 .. g_{K-1} enter the mean (HF `hidden_states[1:]`)
  states = hidden[length:length + len(answer) - 1]
  return (states.mean(0) if len(states) else np.zeros(hidden.shape[-1], np.float32)), len(states), answer


def _check(enc, screen, out, greedy):
  counts = []
  for r, action in enumerate(ACTIONS):
    ref, count, answer = _reference(enc, screen, action, out["tokens"][r], set(enc.eos_ids), greedy)
    assert out["counts"][r] == count
    assert out["tokens"][r, :len(answer)].tolist() == answer and (out["tokens"][r, len(answer):] == -1).all()
    np.testing.assert_allclose(out["reps"][r], ref, atol=2e-4, rtol=2e-4)
    counts.append(count)
  return counts


@pytest.mark.slow
def test_generated_greedy_equals_the_uncached_reference_with_eos_stops(policy, screen):
  free = represent.Encoder(policy, batch=4, max_new_tokens=N, temperature=0.0, eos_ids=()).answers(
      [screen] * len(ACTIONS), ACTIONS)
  assert (free["counts"] == N - 1).all()  # no EOS: K = N tokens, the last one's state is never computed
  _check(represent.Encoder(policy, 4, max_new_tokens=N, temperature=0.0, eos_ids=()), screen, free, True)
  # make the third token of row 0 an EOS: rows whose answer holds it stop there, the others run to N
  enc = represent.Encoder(policy, batch=4, readout="generated", max_new_tokens=N, temperature=0.0,
                          eos_ids=(int(free["tokens"][0, 2]),))
  out = enc.answers([screen] * len(ACTIONS), ACTIONS)
  counts = _check(enc, screen, out, True)
  assert counts[0] == 2 and len(set(counts)) > 1, counts  # an early stop and rows of other lengths
  # an EOS first: nothing to average, the rep is zeros (the seeds' client stores zeros when host.py fails)
  first = represent.Encoder(policy, batch=4, max_new_tokens=N, temperature=0.0, eos_ids=(int(free["tokens"][2, 0]),))
  zero = first.answers([screen] * len(ACTIONS), ACTIONS)
  assert _check(first, screen, zero, True)[2] == 0
  np.testing.assert_array_equal(zero["reps"][2], 0.0)
  np.testing.assert_array_equal(enc.pairs([screen] * len(ACTIONS), ACTIONS), out["reps"])
  # not the prompt_last readout
  last = represent.Encoder(policy, batch=4, readout="prompt_last").pairs([screen] * len(ACTIONS), ACTIONS)
  assert not np.allclose(out["reps"][1], last[1], atol=1e-3)


@pytest.mark.slow
def test_generated_sampled_is_the_default_and_is_seeded_per_pair(policy, screen):
  enc = represent.Encoder(policy, batch=4)  # the defaults: generated, 5 new tokens, temperature 0.2
  assert (enc.readout, enc.max_new_tokens, enc.temperature) == ("generated", 5, 0.2)
  assert enc.eos_ids == tuple(sorted(policy.eos_ids))
  out = enc.answers([screen] * len(ACTIONS), ACTIONS)
  _check(enc, screen, out, False)
  # the same pair in another row and another (padded) batch samples the same answer
  np.testing.assert_array_equal(out["tokens"][4], out["tokens"][0])
  np.testing.assert_allclose(out["reps"][4], out["reps"][0], atol=1e-5)
  alone = enc.answers([screen], ACTIONS[3:4])
  np.testing.assert_array_equal(alone["tokens"][0], out["tokens"][3])
  np.testing.assert_allclose(alone["reps"][0], out["reps"][3], atol=1e-5)
  # it samples: another seed at a high temperature draws other answers
  hot = [represent.Encoder(policy, batch=4, temperature=5.0, seed=s).answers([screen] * 4, ACTIONS[:4])["tokens"]
         for s in (0, 1)]
  assert not np.array_equal(hot[0], hot[1])


@pytest.mark.slow
def test_prompt_last_is_the_state_at_the_last_prompt_token(policy, screen):
  enc = represent.Encoder(policy, batch=4, readout="prompt_last")
  out = enc.answers([screen] * len(ACTIONS), ACTIONS)
  assert set(out) == {"reps"}
  for r, action in enumerate(ACTIONS):
    hidden, length = _full_hidden(enc, screen, action, [])
    np.testing.assert_allclose(out["reps"][r], hidden[length - 1], atol=2e-4, rtol=2e-4)


def test_prompt_ids_are_the_training_render_prefix(policy):
  from jaxagent.data import conversation  # pylint: disable=g-import-not-at-top
  enc = represent.Encoder(policy, batch=4)
  prompt = digiq_data.representation_prompt(ACTIONS[0])
  item = {"id": "x", "images": ["a.png"], "conversations": [{"from": "human", "value": prompt},
                                                              {"from": "gpt", "value": "Yes"}]}
  train_ids, loss = conversation.tokenize(item, policy.tokenizer, policy.num_image_tokens)
  ids = enc._ids(prompt)  # pylint: disable=protected-access
  np.testing.assert_array_equal(train_ids[:len(ids)], ids)
  assert loss[:len(ids)].sum() == 0 and loss[len(ids)] == 1  # the answer starts right after


def test_encoder_rejects_bad_settings(policy):
  with pytest.raises(ValueError, match="readout"):
    represent.Encoder(policy, readout="mean")
  with pytest.raises(ValueError, match="max_new_tokens"):
    represent.Encoder(policy, max_new_tokens=1)
  with pytest.raises(ValueError, match="temperature"):
    represent.Encoder(policy, temperature=-1.0)
  represent.Encoder(policy, readout="prompt_last", max_new_tokens=1)  # unused by prompt_last
