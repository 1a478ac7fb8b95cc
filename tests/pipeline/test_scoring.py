"""One-pass scoring of text samples (`pipeline/scoring.py`) against a hand forward pass of a tiny decoder."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.data import conversation
from jaxagent.pipeline import scoring
from jaxagent.serving.checkpoint import LoadedModel


@pytest.fixture(scope="module")
def loaded():
  from jaxagent.serving.checkpoint import random_policy
  return random_policy("decoder", seed=5, num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128)


def _sample(prompt, reply, sid="s"):
  return {"id": sid, "images": [], "conversations": [{"from": "human", "value": prompt},
                                                     {"from": "gpt", "value": reply}]}


def _hand(loaded, item, cut=0):
  """(logp, tokens, logits at the reply start [V], hidden there [D]) from one unpadded forward pass."""
  ids, loss = conversation.tokenize(item, loaded.tokenizer, 1)
  ids, loss = ids[cut:], loss[cut:]
  logits, hidden = loaded.model(jnp.asarray(ids[None, :-1]), return_hidden=True)
  logits, hidden = np.asarray(logits, np.float64)[0], np.asarray(hidden)[0]
  m = logits.max(-1, keepdims=True)
  logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
  targets, on = ids[1:], loss[1:] > 0
  lp = logp[np.arange(len(targets)), targets][on].sum()
  at = int(np.flatnonzero(loss)[0]) - 1
  return lp, int(on.sum()), logits[at], hidden[at], at, ids, loss


SHORT = _sample("hi", "do(action=\"Click\", element=\"3\")", "short")
MID = _sample("Task Instruction: buy a mug\n\nRound 0\n\n<html>page</html>", "exit(message=\"ok\")", "mid")
LONG = _sample("x" * 10 + " ".join(f"word{i}" for i in range(60)), "YES", "long")  # > 128 tokens: a bigger bucket


@pytest.mark.slow
def test_score_is_the_replys_log_probability_and_the_state_at_its_start(loaded):
  out = scoring.score(loaded, [MID])
  lp, n, logits, hidden, at, ids, loss = _hand(loaded, MID)
  assert n == int(loss.sum()) and n > 0 and loss[0] == 0
  assert out["tokens"].tolist() == [n]
  np.testing.assert_allclose(out["logp"][0], lp, rtol=1e-5, atol=1e-5)
  assert out["logits"].shape == (1, logits.shape[-1])
  np.testing.assert_allclose(out["logits"][0], logits, atol=1e-5)
  np.testing.assert_allclose(out["hidden"][0], hidden, atol=1e-5)
  assert loss[at] == 0 and loss[at + 1] == 1  # `at` predicts the reply's first token


@pytest.mark.slow
def test_per_token_gives_each_reply_tokens_log_probability_in_order(loaded):
  out = scoring.score(loaded, [SHORT, LONG, MID], batch=2, per_token=True)  # two buckets, rows sorted by length
  for k, item in enumerate((SHORT, LONG, MID)):
    ids, loss = conversation.tokenize(item, loaded.tokenizer, 1)
    logits = np.asarray(loaded.model(jnp.asarray(ids[None, :-1])), np.float64)[0]
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    on = np.flatnonzero(loss[1:])
    np.testing.assert_array_equal(out["reply_ids"][k], ids[1:][on])
    np.testing.assert_allclose(out["token_logp"][k], logp[on, ids[1:][on]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["token_logp"][k].sum(), out["logp"][k], rtol=1e-5, atol=1e-5)
  assert "token_logp" not in scoring.score(loaded, [MID])


@pytest.mark.slow
def test_logit_ids_and_offset_pick_columns_later_in_the_reply(loaded):
  ids, loss = conversation.tokenize(MID, loaded.tokenizer, 1)
  at = int(np.flatnonzero(loss)[0]) - 1
  full = np.asarray(loaded.model(jnp.asarray(ids[None, :-1])))[0]
  pick = [7, 3, 11]
  out = scoring.score(loaded, [MID], logit_ids=pick, offset=2)
  np.testing.assert_allclose(out["logits"][0], full[at + 2, pick], atol=1e-5)


@pytest.mark.slow  # over 2 s alone
def test_scores_do_not_depend_on_the_batch_around_a_sample(loaded):
  items = [LONG, MID, SHORT]
  lengths = [len(conversation.tokenize(x, loaded.tokenizer, 1)[0]) for x in items]
  assert lengths[0] - 1 > scoring.MIN_BUCKET > lengths[1] > lengths[2]  # two buckets, three lengths
  together = scoring.score(loaded, items, batch=3)
  pairs = scoring.score(loaded, items, batch=2)  # sorted by length: [SHORT, MID] then [LONG]
  for i, item in enumerate(items):
    alone = scoring.score(loaded, [item], batch=1)
    n = int(conversation.tokenize(item, loaded.tokenizer, 1)[1].sum())
    for out in (together, pairs):
      assert out["tokens"][i] == alone["tokens"][0] == n
      np.testing.assert_allclose(out["logp"][i], alone["logp"][0], rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(out["logits"][i], alone["logits"][0], atol=1e-5)
      np.testing.assert_allclose(out["hidden"][i], alone["hidden"][0], atol=1e-5)
  assert len(set(together["logp"].tolist())) == 3  # three different samples, three different scores


@pytest.mark.slow
def test_max_len_cuts_the_prompt_from_the_left_and_keeps_the_reply(loaded):
  ids, loss = conversation.tokenize(MID, loaded.tokenizer, 1)
  max_len = len(ids) - 1 - 5
  out = scoring.score(loaded, [MID], max_len=max_len)
  lp, n, logits, hidden, at, cut_ids, cut_loss = _hand(loaded, MID, cut=5)
  assert len(cut_ids) - 1 == max_len and cut_loss.sum() == loss.sum()
  assert out["tokens"][0] == loss.sum()
  np.testing.assert_allclose(out["logp"][0], lp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out["hidden"][0], hidden, atol=1e-5)
  full = scoring.score(loaded, [MID])
  assert not np.allclose(out["hidden"][0], full["hidden"][0])  # the cut changed the context
  same = scoring.score(loaded, [MID], max_len=len(ids) - 1)  # fits: nothing cut
  np.testing.assert_allclose(same["logp"], full["logp"], rtol=1e-6)
  with pytest.raises(ValueError, match="reply alone"):
    scoring.score(loaded, [MID], max_len=int(loss.sum()) - 1)


def test_a_sample_without_a_reply_or_a_model_that_is_not_a_decoder_is_refused(loaded):
  no_reply = {"id": "q", "images": [], "conversations": [{"from": "human", "value": "only a question"}]}
  with pytest.raises(ValueError, match="no assistant reply"):
    scoring.score(loaded, [no_reply])
  with pytest.raises(ValueError, match="no assistant reply"):
    scoring.encode(no_reply, loaded.tokenizer)
  vlm = LoadedModel(model=None, tokenizer=loaded.tokenizer, kind="vlm", name="v")
  with pytest.raises(ValueError, match="text decoders"):
    scoring.score(vlm, [MID])


def test_scoring_nothing_returns_empty_arrays(loaded):
  out = scoring.score(loaded, [])
  assert out["logp"].shape == (0,) and out["tokens"].shape == (0,) and out["hidden"].shape[0] == 0


def test_buckets_are_powers_of_two_from_the_minimum():
  assert [scoring._bucket(n) for n in (0, 1, 128, 129, 256, 300)] == [128, 128, 128, 256, 256, 512]
