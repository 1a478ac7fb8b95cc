"""Digi-Q critic: shapes, paper widths, text-field extraction, gradient flow, sharding metadata; the code's
frame stacking, trajectory-level validation split and randomly initialised target."""

import jax
import ml_collections
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxagent import sharding, types
from jaxagent.data import transitions
from jaxagent.models import critic as C
from jaxagent.proj.digiq import critic as critic_lib
from jaxagent.proj.digiq import features
from jaxagent.rl import losses, targets

TAP = ('Action Plan: [DUAL_POINT] ; Action Decision: "action_type": "DUAL_POINT", "touch_point": '
       '"[0.7761, 0.7089]", "lift_point": "[0.7761, 0.7089]", "typed_text": ""')
TYPE = ('Action Plan: [TYPE,PRESS_ENTER] ; Action Decision: "action_type": "TYPE", "touch_point": '
        '"[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": "running shoes"')
OBS0 = "Previous Actions: Goal: Search for running shoes on ebay</s>"
OBS1 = ('Previous Actions: "action_type": "DUAL_POINT", "touch_point": "[0.5, 0.5]", "lift_point": '
        '"[0.5, 0.5]", "typed_text": "" Goal: Open the settings app</s>')


@pytest.fixture(scope="module")
def model():
  """One tiny regression critic shared by the tests (initialising is the slow part on a loaded CPU)."""
  return C.DigiQCritic(C.CriticConfig.tiny(image_dim=8, rep_dim=8), rngs=nnx.Rngs(0))


def _batch(cfg, actions, n=None, seed=0):
  rng = np.random.default_rng(seed)
  b = features.featurize([OBS0, OBS1], actions, cfg)
  b["image_features"] = rng.normal(size=(2, cfg.image_dim)).astype(np.float32)
  shape = (2, cfg.rep_dim) if n is None else (2, n, cfg.rep_dim)
  b["q_rep"] = rng.normal(size=shape).astype(np.float32)
  return {k: jnp.asarray(v) for k, v in b.items()}


def test_text_fields_follow_the_original_critic_parse():
  assert features.critic_text_fields(OBS0) == ("", "Search for running shoes on ebay")
  prev, goal = features.critic_text_fields(OBS1)
  assert goal == "Open the settings app" and prev.startswith('"action_type": "DUAL_POINT"')
  assert features.action_type_and_text(TYPE) == ("TYPE", "running shoes")
  assert features.action_type_and_text(TAP) == ("DUAL_POINT", "")
  assert features.action_type_and_text("not an action") == ("not an action", "not an action")  # raw for both
  assert features.action_type_and_text(prev) == ("DUAL_POINT", "")


def test_hash_text_is_deterministic_and_padded():
  ids = features.encode_texts(["Search shoes", ""], vocab=64, max_tokens=8)
  assert ids.shape == (2, 8) and ids.dtype == np.int32
  assert (ids[0] > 0).all() and (ids[1] == 0).all()  # 2 words + 10 trigrams truncated to 8; empty = all pad
  assert features.hash_text("Search shoes", 64, 8) == ids[0].tolist()
  assert ((ids >= 0) & (ids < 64)).all()


def test_critic_output_shapes_single_and_candidates(model):
  cfg = model.cfg
  forward = nnx.jit(lambda m, b: m(b))
  q1, q2, v1, v2 = forward(model, _batch(cfg, [TAP, TYPE]))
  assert q1.shape == q2.shape == v1.shape == v2.shape == (2, 1)
  cands = [[TAP, TYPE, "junk"], [TYPE, TAP, TAP]]
  batch = _batch(cfg, cands, n=3)
  q1n, q2n, v1n, _ = forward(model, batch)
  assert q1n.shape == q2n.shape == (2, 3, 1) and v1n.shape == (2, 1)
  # candidate k of the [B, N] call equals a single-action call with that candidate
  single = dict(batch, act_type=batch["act_type"][:, 1], act_text=batch["act_text"][:, 1],
                q_rep=batch["q_rep"][:, 1])
  out = forward(model, single)
  np.testing.assert_allclose(out[0], q1n[:, 1], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out[2], v1n, rtol=1e-6)  # V ignores the action


def test_classification_heads_have_two_outputs():
  cfg = C.CriticConfig.tiny(image_dim=8, rep_dim=8, learn_metric="classification")
  model = C.DigiQCritic(cfg, rngs=nnx.Rngs(0))
  q1, q2, v1, _ = model(_batch(cfg, [TAP, TYPE]))
  assert q1.shape == (2, 2) and v1.shape == (2, 2)
  q, v = critic_lib.head_scores(model, _batch(cfg, [TAP, TYPE]))  # softmax[1] of each head
  np.testing.assert_allclose(q[:, 1], jax.nn.softmax(q2, -1)[:, 1], rtol=1e-6)
  assert q.shape == (2, 2) and v.shape == (2, 2) and bool(jnp.all((q > 0) & (q < 1)))


@pytest.mark.slow
def test_scores_feed_best_of_n_selection(model):
  cfg = model.cfg
  batch = _batch(cfg, [[TAP, TYPE, "junk"], [TYPE, TAP, TAP]], n=3)
  q, v = critic_lib.head_scores(model, batch)
  q1, q2, v1, v2 = model(batch)
  assert q.shape == (2, 3, 2) and v.shape == (2, 2)
  np.testing.assert_allclose(q[..., 0], q1[..., 0])
  valid = jnp.array([[True, True, False], [True, True, True]])
  idx, adv = losses.best_of_n_select(q, v, valid)
  expected = jnp.where(valid, jnp.maximum(q1, q2)[..., 0] - jnp.maximum(v1, v2), 0.0)
  np.testing.assert_array_equal(idx, jnp.argmax(expected, 1))


def test_paper_widths_match_digiq():
  cfg = C.CriticConfig.paper()
  assert cfg.q_in == 10752 and cfg.q_widths == (10752, 3840, 3840, 3840)
  assert cfg.v_in == 5120 and cfg.v_widths == (2304, 2304, 2304)
  shapes = nnx.eval_shape(lambda: C.DigiQCritic(cfg, rngs=nnx.Rngs(0)))
  kernels = [layer.kernel.get_value().shape for layer in shapes.q1.hidden] + [shapes.q1.out.kernel.get_value().shape]
  assert kernels == [(10752, 10752), (10752, 3840), (3840, 3840), (3840, 3840), (3840, 1)]
  vk = [layer.kernel.get_value().shape for layer in shapes.v1.hidden] + [shapes.v1.out.kernel.get_value().shape]
  assert vk == [(5120, 2304), (2304, 2304), (2304, 2304), (2304, 1)]


def test_td_loss_gradients_reach_every_parameter(model):
  cfg = model.cfg
  target = nnx.clone(model)  # a target network (its outputs carry no gradient)
  batch = _batch(cfg, [TAP, TYPE])
  next_batch = dict(batch, image_features=batch["image_features"] + 1.0)
  r, done = jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0])

  def loss_fn(m):
    q1, q2, v1, v2 = m(batch)
    tq1, tq2, _, _ = target(batch)
    _, _, tv1, tv2 = target(next_batch)
    y_q, y_v = losses.digiq_td_targets(r, done, 0.95, tq1[:, 0], tq2[:, 0], tv1[:, 0], tv2[:, 0])
    return losses.digiq_critic_loss(q1, q2, v1, v2, y_q, y_v)[0]

  grads = nnx.jit(nnx.grad(loss_fn))(model)
  norms = {jax.tree_util.keystr(p): float(jnp.linalg.norm(g)) for p, g in jax.tree_util.tree_leaves_with_path(grads)}
  assert norms and all(np.isfinite(list(norms.values())))
  dead = [k for k, v in norms.items() if v == 0.0 and "embedding" not in k]
  assert not dead, f"no gradient reaches {dead}"
  # embeddings get gradient through the features that occur in the batch
  assert norms[[k for k in norms if "task_encoder" in k and "embedding" in k][0]] > 0


def test_params_carry_logical_axes_and_shard(model):
  state = nnx.state(model, nnx.Param)
  is_var = lambda x: isinstance(x, nnx.Variable)
  for var in jax.tree.leaves(state, is_leaf=is_var):
    axes = var.get_metadata().get("logical_axes")
    assert axes is not None and len(axes) == var.get_value().ndim
    assert set(axes) <= {"embed", "mlp", "value_out", "vocab"}
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  specs = jax.tree.leaves(sharding.state_specs(state, mesh), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  assert any(len(s) for s in specs)  # something is actually split over the mesh


def test_bad_feature_widths_name_the_field(model):
  cfg = model.cfg
  batch = _batch(cfg, [TAP, TYPE])
  with pytest.raises(ValueError, match="image_dim"):
    model(dict(batch, image_features=jnp.zeros((2, 5))))
  with pytest.raises(ValueError, match="rep_dim"):
    model(dict(batch, q_rep=jnp.zeros((2, 5))))
  with pytest.raises(ValueError, match="out_dim"):
    C.CriticConfig(out_dim=3)


def _cand_batch(cfg, seed=0):
  cands = [[TAP, TYPE, "junk"], [TYPE, TAP, TAP]]
  b = _batch(cfg, [c[0] for c in cands], seed=seed)
  cb = features.featurize([OBS0, OBS1], cands, cfg)
  b["cand_type"], b["cand_text"] = jnp.asarray(cb["act_type"]), jnp.asarray(cb["act_text"])
  b["cand_rep"] = jnp.asarray(np.random.default_rng(seed + 1).normal(size=(2, 3, cfg.rep_dim)), jnp.float32)
  b["cand_rep"] = b["cand_rep"].at[:, 0].set(b["q_rep"])  # index 0 = the dataset action
  return b


@pytest.mark.slow
def test_td_loss_wiring_matches_the_digiq_code(model):
  """Transcribes `critic_loss` (bellman): Q_i on r + (1-done)·γ·V̄_i(s'), V_i on Q̄_i(s, a_b)."""
  cfg = model.cfg
  target = nnx.clone(model)
  nnx.update(target, jax.tree.map(lambda x: 0.5 * x, nnx.state(target, nnx.Param)))
  batch = _cand_batch(cfg)
  next_state = {k: batch[k] for k in ("goal", "prev_type", "prev_text")}
  next_state["image_features"] = batch["image_features"][::-1]
  r, done = jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0])
  fwd = nnx.jit(lambda m, b: m(b))
  q1, q2, v1, v2 = (np.asarray(x)[:, 0] for x in fwd(model, batch))
  tq1, tq2, _, _ = (np.asarray(x)[:, 0] for x in fwd(target, batch))
  _, _, tv1, tv2 = (np.asarray(x)[:, 0] for x in fwd(target, dict(batch, **next_state)))
  mse = lambda a, b: np.mean((a - b) ** 2)

  def expected(bq1, bq2):
    yq1, yq2 = r + (1 - done) * 0.95 * tv1, r + (1 - done) * 0.95 * tv2
    return mse(q1, yq1) + mse(q2, yq2) + mse(v1, bq1) + mse(v2, bq2)

  loss = nnx.jit(lambda m, t: critic_lib.td_loss(m, t, batch, next_state, r, done)[0])(model, target)
  np.testing.assert_allclose(loss, expected(tq1, tq2), rtol=1e-4)
  # the paper's V backup over π_β candidates: the mean, or one sampled index
  cand = dict(batch, act_type=batch["cand_type"], act_text=batch["cand_text"], q_rep=batch["cand_rep"])
  cq1, cq2, _, _ = (np.asarray(x)[..., 0] for x in fwd(target, cand))
  np.testing.assert_allclose(cq1[:, 0], tq1, rtol=1e-5)
  mean_loss = nnx.jit(lambda m, t: critic_lib.td_loss(m, t, batch, next_state, r, done, backup="mean")[0])(model, target)
  np.testing.assert_allclose(mean_loss, expected(cq1.mean(1), cq2.mean(1)), rtol=1e-4)
  sample_loss = critic_lib.td_loss(model, target, batch, next_state, r, done, backup="sample", key=jax.random.key(3))[0]
  per_index = [expected(cq1[:, k], cq2[:, k]) for k in range(3)]
  assert min(abs(float(sample_loss) - e) for e in per_index) < 1e-4 * max(per_index)
  # mc: every head on G_t
  g = jnp.array([0.25, 1.0])
  mc = critic_lib.td_loss(model, target, batch, next_state, r, done, mc_return=g, advantage_estimation="mc")[0]
  np.testing.assert_allclose(mc, mse(q1, g) + mse(q2, g) + mse(v1, g) + mse(v2, g), rtol=1e-4)
  with pytest.raises(ValueError, match="cand_rep"):
    critic_lib.td_loss(model, target, {k: v for k, v in batch.items() if not k.startswith("cand")}, next_state, r, done,
              backup="mean")


def test_best_of_n_weights_from_the_critic(model):
  cfg = model.cfg
  batch = _batch(cfg, [[TAP, TYPE, "junk"], [TYPE, TAP, TAP]], n=3)
  valid = jnp.array([[True, True, False], [True, True, True]])
  q, v = critic_lib.head_scores(model, batch)
  actor = ml_collections.ConfigDict(dict(loss="best-of-n", threshold=0.0, pg_multiplier=5.0, awr_beta=0.01,
                                         head_reduce="max"))
  idx, adv, w = critic_lib.best_of_n(actor, {"q": np.asarray(q), "v": np.asarray(v), "valid": np.asarray(valid)})
  idx2, adv2 = losses.best_of_n_select(q, v, valid)
  np.testing.assert_array_equal(idx, idx2)
  np.testing.assert_allclose(adv, adv2, rtol=1e-5)
  np.testing.assert_array_equal(w, (np.clip(adv2, 0, 1) > 0).astype(np.float32))


@pytest.mark.slow
def test_td_training_with_a_target_network_recovers_discounted_values(model):
  """A two-step chain s0 -(r=0)-> s1 -(r=1, done)-> end: the §5.4 fixed point is Q(s1)=V(s1)=1 and
  Q(s0)=V(s0)=γ. Adam on td_loss with a Polyak-averaged target (τ = 0.1 every step) must reach it."""
  cfg = model.cfg
  online = nnx.clone(model)
  target = nnx.clone(model)
  states = _batch(cfg, [TAP, TAP], seed=5)
  states["q_rep"] = states["image_features"]  # (s, a) rep: one per state
  # s0's successor is s1 (all of its state fields); s1's successor is never read (done)
  next_state = {k: states[k][jnp.array([1, 1])] for k in ("goal", "prev_type", "prev_text", "image_features")}
  r, done, gamma = jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0]), 0.95
  opt = nnx.Optimizer(online, optax.adam(3e-3), wrt=nnx.Param)

  @nnx.jit
  def train_step(online, target, opt):
    loss, grads = nnx.value_and_grad(lambda m: critic_lib.td_loss(m, target, states, next_state, r, done, gamma)[0])(online)
    opt.update(online, grads)
    targets.soft_update(target, online, 0.1)
    return loss

  for _ in range(300):
    loss = train_step(online, target, opt)
  q1, q2, v1, v2 = online(states)
  for head in (q1, q2, v1, v2):
    np.testing.assert_allclose(head[:, 0], [gamma, 1.0], atol=0.03)
  assert float(loss) < 1e-3


# ------------------------------------------------------------ CPU substitutions: bag of words, tap points

SWIPE = ('Action Plan: [DUAL_POINT] ; Action Decision: "action_type": "DUAL_POINT", "touch_point": '
         '"[0.2, 0.8]", "lift_point": "[0.2, 0.3]", "typed_text": ""')


def test_action_point_reads_taps_and_swipes_only():
  np.testing.assert_allclose(features.action_point(TAP), [0.7761, 0.7089, 0.7761, 0.7089, 1.0], rtol=1e-6)
  np.testing.assert_allclose(features.action_point(SWIPE), [0.2, 0.8, 0.2, 0.3, 1.0], rtol=1e-6)
  prev, _ = features.critic_text_fields(OBS1)  # the critic's previous-action field has no "Action Plan"
  np.testing.assert_allclose(features.action_point(prev), [0.5, 0.5, 0.5, 0.5, 1.0])
  for other in (TYPE, "junk", "", TAP.replace("[0.7761, 0.7089]", "[0.7761")):
    assert features.action_point(other).tolist() == [0.0] * 5, other


def test_fourier_points_hand_values():
  out = np.asarray(C.fourier_points(jnp.array([[0.5, 0.25, 0.0, 1.0, 1.0], [0.5, 0.25, 0.0, 1.0, 0.0]]), 2))
  assert out.shape == (2, 17)
  s2 = np.sqrt(0.5)
  # [sin 2^k π c for c in (0.5, 0.25, 0, 1), k in (0, 1)] then the cosines, then the flag
  want_sin = [1.0, 0.0, s2, 1.0, 0.0, 0.0, 0.0, 0.0]
  want_cos = [0.0, -1.0, s2, 0.0, 1.0, 1.0, -1.0, 1.0]
  np.testing.assert_allclose(out[0], want_sin + want_cos + [1.0], atol=1e-6)
  assert out[1].tolist() == [0.0] * 17  # no point: all zeros, flag 0


def test_bag_of_words_sums_word_embeddings_without_trigrams():
  cfg = C.CriticConfig.tiny(image_dim=8, rep_dim=8, text_encoder="bag_of_words")
  ids = features.featurize([OBS1], [TAP], cfg)["goal"][0]
  words = features._WORD_RE.findall("Open the settings app".lower())
  assert int((ids > 0).sum()) == len(words) == 4  # words only: no character trigrams
  enc = C.BagOfWordsEncoder(cfg.text_vocab, cfg.text_dim, rngs=nnx.Rngs(0))
  table = np.asarray(enc.embed.embedding[...])
  np.testing.assert_allclose(np.asarray(enc(jnp.asarray(ids[None])))[0], table[ids[ids > 0]].sum(0), rtol=1e-5)
  with pytest.raises(ValueError, match="text_encoder"):
    C.CriticConfig(text_encoder="roberta")
  with pytest.raises(ValueError, match="point_octaves"):
    C.CriticConfig(point_octaves=-1)


@pytest.mark.slow
def test_point_features_reach_q_not_v():
  cfg = C.CriticConfig.tiny(image_dim=8, rep_dim=8, point_octaves=3)
  assert cfg.q_in == C.CriticConfig.tiny(image_dim=8, rep_dim=8).q_in + 2 * 25
  model = C.DigiQCritic(cfg, rngs=nnx.Rngs(0))
  batch = _batch(cfg, [[TAP, SWIPE], [TYPE, TAP]], n=2)
  assert batch["act_point"].shape == (2, 2, 5) and batch["prev_point"].shape == (2, 5)
  q1, _, v1, _ = model(batch)
  moved = dict(batch, act_point=batch["act_point"].at[:, :, 1].add(0.3))
  q1m, _, v1m, _ = model(moved)
  np.testing.assert_allclose(v1m, v1)  # V never sees the candidate
  assert np.abs(np.asarray(q1m - q1))[0].min() > 0  # both taps of state 0 moved, both Q changed
  np.testing.assert_allclose(q1m[1, 0], q1[1, 0])  # a TYPE action has no point: unchanged
  with pytest.raises(ValueError, match="act_point"):
    model({k: v for k, v in batch.items() if k != "act_point"})
  with pytest.raises(ValueError, match="prev_point"):
    model({k: v for k, v in batch.items() if k != "prev_point"})


@pytest.mark.slow
def test_bag_of_words_and_points_learn_which_tap_a_goal_needs():
  """The CPU default's job at the category step: one screen, a goal naming one of 4 categories, taps at 4 heights;
  a tap succeeds iff its height is the goal's category. MC regression (the default) on the dataset action of each
  row must rank the right tap first for every goal; without point features the taps are indistinguishable."""
  names = ["lighting", "kitchen", "outdoor", "fitness"]
  obs = [f"Previous Actions: Goal: On Shoply, show the {n} category sorted by price.</s>" for n in names]
  tap = lambda k: TAP.replace("[0.7761, 0.7089]", f"[0.5000, {0.3 + 0.05 * k:.4f}]")
  rng = np.random.default_rng(0)
  goal_idx, tap_idx = rng.integers(0, 4, 256), rng.integers(0, 4, 256)
  ret = (goal_idx == tap_idx).astype(np.float32)

  def rank(point_octaves):
    cfg = C.CriticConfig.tiny(image_dim=4, rep_dim=4, text_encoder="bag_of_words", point_octaves=point_octaves)
    model = C.DigiQCritic(cfg, rngs=nnx.Rngs(0))
    b = features.featurize([obs[g] for g in goal_idx], [tap(t) for t in tap_idx], cfg)
    b["image_features"] = np.zeros((256, 4), np.float32)
    b["q_rep"] = np.zeros((256, 4), np.float32)  # a representation that does not see the tap
    b = {k: jnp.asarray(v) for k, v in b.items()}
    opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    zeros = jnp.zeros(256)  # reward and done: unused by the MC targets

    @nnx.jit
    def step(model, opt):
      loss_fn = lambda m: critic_lib.td_loss(m, m, b, b, zeros, zeros, mc_return=jnp.asarray(ret),
                                    advantage_estimation="mc")[0]
      opt.update(model, nnx.grad(loss_fn)(model))

    for _ in range(300):
      step(model, opt)
    cands = features.featurize(obs, [[tap(k) for k in range(4)]] * 4, cfg)
    cands.update(image_features=np.zeros((4, 4), np.float32), q_rep=np.zeros((4, 4, 4), np.float32))
    q, _ = critic_lib.head_scores(model, {k: jnp.asarray(v) for k, v in cands.items()})
    return np.asarray(q).max(-1)  # [goal, tap]

  q = rank(3)
  assert (q.argmax(1) == np.arange(4)).all(), q
  assert np.ptp(rank(0), axis=1).max() < 1e-6  # no point features: every tap scores the same


# ------------------------------------------------------------------- the critic on the shared training loop


def _chain_rows(cfg):
  """The two-step chain above as `transition_arrays`-style rows (bellman, dataset backup)."""
  states = {k: np.asarray(v) for k, v in _batch(cfg, [TAP, TAP], seed=5).items()}
  rows = dict(states, q_rep=states["image_features"])
  for k in ("goal", "prev_type", "prev_text", "image_features"):
    rows["next_" + k] = states[k][[1, 1]]
  rows.update(reward=np.array([0.0, 1.0], np.float32), done=np.array([0.0, 1.0], np.float32),
              mc_return=np.array([0.95, 1.0], np.float32))
  return rows


def _critic_config(steps):
  from jaxagent import config_lib
  from jaxagent.pipeline.config import stage_config
  c = config_lib.base_config(staged=True)
  c.recipe = "digiq"
  c.train.progress_bar = False
  c.checkpoint.async_save = False
  c.critic = config_lib.stage(steps=steps, batch_size=2, lr=3e-3, warmup_steps=0, end_lr_ratio=1.0)
  c.critic.update(gamma=0.95, tau=0.1, target_every=1, backup="dataset", advantage_estimation="bellman",
                  target_init="random")
  return stage_config(c, c.critic)


@pytest.mark.slow
@pytest.mark.long
def test_critic_trains_on_the_shared_loop_to_the_td_fixed_point(model, tmp_path):
  """`train_critic` (Grain batches, Orbax, the target moved inside the step) reaches the chain's TD fixed point
  in 300 steps, its Polyak target beside the online critic (the raw loop's convergence, in the README's command:
  `test_td_training_with_a_target_network_recovers_discounted_values`)."""
  cfg, rows = model.cfg, _chain_rows(model.cfg)
  whole = critic_lib.train_critic(_critic_config(300), str(tmp_path / "whole"), rows, cfg)
  q1, q2, v1, v2 = whole.online({k: jnp.asarray(v) for k, v in rows.items() if not k.startswith("next_")})
  for head in (q1, q2, v1, v2):
    np.testing.assert_allclose(head[:, 0], [0.95, 1.0], atol=0.05)
  online, target = nnx.state(whole.online, nnx.Param), nnx.state(whole.target, nnx.Param)
  assert max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(online), jax.tree.leaves(target))) < 0.05


@pytest.mark.slow
def test_critic_on_the_shared_loop_moves_its_target_and_resumes_exactly(model, tmp_path):
  """`train_critic`'s target follows the online critic inside the step, and a run stopped at step 10 and
  continued to 20 ends with the parameters (online and target) of an unbroken 20-step run (resuming is exact at
  any step: a short run says so as well as a long one)."""
  cfg, rows = model.cfg, _chain_rows(model.cfg)
  unbroken = critic_lib.train_critic(_critic_config(20), str(tmp_path / "unbroken"), rows, cfg)
  first = critic_lib.CriticWithTarget(cfg, 0)
  start, end = (jax.tree.leaves(nnx.state(m.target, nnx.Param)) for m in (first, unbroken))
  assert any(float(jnp.abs(a - b).max()) > 1e-3 for a, b in zip(start, end))  # it followed
  critic_lib.train_critic(_critic_config(10), str(tmp_path / "split"), rows, cfg)
  resumed = critic_lib.train_critic(_critic_config(20), str(tmp_path / "split"), rows, cfg)
  for a, b in zip(jax.tree.leaves(nnx.state(unbroken)), jax.tree.leaves(nnx.state(resumed))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------- the code's frame stacking, validation split and target init


def test_frame_stack_puts_the_previous_rows_screen_first():
  # rows out of order, and trajectory 1 lacks a row for step 1 (no screenshot): its step 2 starts afresh
  rows = np.array([[0, 2], [0, 0], [1, 0], [0, 1], [1, 2]])
  image = np.array([[3.0], [1.0], [7.0], [2.0], [9.0]])  # f_t of each row
  next_image = np.array([[4.0], [2.0], [8.0], [3.0], [10.0]])  # f_{t+1}
  s, s_next = transitions.frame_stack(rows, image, next_image)
  # s = [f_{t-1} ‖ f_t] with f_{-1} := f_0 (`offpolicy_train_loop.py:framestack`); s' = [f_t ‖ f_{t+1}]
  np.testing.assert_array_equal(s, [[2, 3], [1, 1], [7, 7], [1, 2], [9, 9]])
  np.testing.assert_array_equal(s_next, [[3, 4], [1, 2], [7, 8], [2, 3], [9, 10]])
  with pytest.raises(ValueError, match="repeat"):
    transitions.frame_stack(np.array([[0, 0], [0, 0]]), image[:2], next_image[:2])


def _traj(goal, n, success):
  task = types.Task(id=goal, intent=goal, site="shop", start_url="http://localhost/")
  steps = [types.Step(step=k, obs_text=f"Previous Actions: Goal: {goal}</s>", action_text=TAP, image_path=f"{k}.png",
                      candidates=[TAP, TYPE]) for k in range(n)]
  return types.Trajectory(task, steps, success=success)


def _cache(trajs, dim=3, rep_dim=4):
  rows = [(i, k) for i, t in enumerate(trajs) for k in range(len(t.steps))]
  screen = lambda i, k: np.full(dim, 10.0 * i + k, np.float32)  # trajectory i's k-th screen
  return {"rows": np.asarray(rows, np.int32), "image": np.stack([screen(i, k) for i, k in rows]),
          "next_image": np.stack([screen(i, k + 1) for i, k in rows]),
          "reps": np.random.default_rng(0).normal(size=(len(rows), 2, rep_dim)).astype(np.float32)}


def _recipe_critic(**critic):
  c = ml_collections.ConfigDict(dict(text_dim=8, learn_metric="regression", text_encoder="bag_of_words",
                                     point_octaves=0, frame_stack=True))
  c.update(critic)
  return ml_collections.ConfigDict(dict(critic=c))


def test_transition_rows_stack_frames_and_the_critic_scores_them():
  trajs = [_traj("a", 3, 1.0), _traj("b", 1, 0.0)]
  cache = _cache(trajs)
  cfg = critic_lib.critic_config(_recipe_critic(), cache)
  assert cfg.image_dim == 6  # two screens of 3
  rows = critic_lib.transition_arrays(trajs, cache, cfg, 0.95, frame_stack=True)
  first = lambda x: x[:, [0, 3]]  # one coordinate of each screen
  np.testing.assert_array_equal(first(rows["image_features"]), [[0, 0], [0, 1], [1, 2], [10, 10]])
  np.testing.assert_array_equal(first(rows["next_image_features"]), [[0, 1], [1, 2], [2, 3], [10, 11]])
  model = C.DigiQCritic(cfg, rngs=nnx.Rngs(0))
  q, v = critic_lib.score_candidates(model, rows)  # scores read the same stacked features
  assert q.shape == (4, 2, 2) and v.shape == (4, 2)
  plain = critic_lib.critic_config(_recipe_critic(frame_stack=False), cache)
  assert plain.image_dim == 3
  unstacked = critic_lib.transition_arrays(trajs, cache, plain, 0.95, frame_stack=False)
  np.testing.assert_array_equal(unstacked["image_features"], cache["image"])
  with pytest.raises(ValueError, match="frame_stack"):
    critic_lib.transition_arrays(trajs, cache, plain, 0.95, frame_stack=True)


def test_held_out_rows_are_whole_trajectories_drawn_by_seed():
  lengths = [3, 1, 4, 2, 5, 1, 2, 3, 2, 4]
  rows = np.array([(i, k) for i, n in enumerate(lengths) for k in range(n)])
  held = critic_lib.held_out_rows(rows, 0.2, seed=7)
  held_trajs = set(rows[held, 0].tolist())
  assert len(held_trajs) == 2  # 10 − int(10 · 0.8), as `offpolicy_train_loop.py` splits
  assert not held_trajs & set(rows[~held, 0].tolist())  # no row of a held-out trajectory trains
  for i in held_trajs:
    assert held[rows[:, 0] == i].all()
  np.testing.assert_array_equal(held, critic_lib.held_out_rows(rows, 0.2, seed=7))  # deterministic per seed
  draws = {tuple(sorted(set(rows[critic_lib.held_out_rows(rows, 0.2, seed=s), 0].tolist()))) for s in range(8)}
  assert len(draws) > 1  # the seed picks them
  assert len(set(rows[critic_lib.held_out_rows(rows, 0.5, seed=7), 0].tolist())) == 5
  assert not critic_lib.held_out_rows(rows, 0.0, seed=7).any()
  train = critic_lib.take_rows({"traj": rows[:, 0]}, ~held)
  assert not set(train["traj"].tolist()) & held_trajs
  for bad in (1.0, -0.1):
    with pytest.raises(ValueError, match=r"critic\.val_fraction"):
      critic_lib.held_out_rows(rows, bad, seed=0)
  with pytest.raises(ValueError, match="none of the 1 trajectories"):
    critic_lib.held_out_rows(np.array([[4, 0], [4, 1]]), 0.2, seed=0)


def _param_gap(a, b):
  return max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(nnx.state(a, nnx.Param)),
                                                           jax.tree.leaves(nnx.state(b, nnx.Param))))


@pytest.mark.slow
def test_target_starts_from_its_own_init_or_as_a_copy():
  cfg = C.CriticConfig.tiny(image_dim=8, rep_dim=8)
  random_init = critic_lib.CriticWithTarget(cfg, 0, "random")
  copied = critic_lib.CriticWithTarget(cfg, 0, "copy")
  assert _param_gap(random_init.target, random_init.online) > 1e-3  # a second critic, as autoui_agent.py builds
  assert _param_gap(copied.target, copied.online) == 0.0
  assert _param_gap(random_init.online, copied.online) == 0.0  # the online critic does not depend on the choice
  with pytest.raises(ValueError, match=r"critic\.target_init"):
    critic_lib.CriticWithTarget(cfg, 0, "zeros")


def test_validation_loss_is_the_training_loss_over_every_held_out_row(model):
  cfg, rows = model.cfg, _chain_rows(model.cfg)
  config = _critic_config(1)
  critic = critic_lib.CriticWithTarget(cfg, 0, "random")
  whole = critic_lib.critic_loss_fn(config)(critic, {k: jnp.asarray(v) for k, v in rows.items()}, jax.random.key(0))
  by_one = critic_lib.validation_loss(config, critic, rows, batch=1)  # chunking does not change the mean
  assert by_one["loss"] == pytest.approx(float(whole[0]), rel=1e-5)
  assert by_one["q1_loss"] == pytest.approx(float(whole[1]["q1_loss"]), rel=1e-5)
  assert critic_lib.validation_loss(config, critic, rows)["loss"] == pytest.approx(by_one["loss"], rel=1e-5)
