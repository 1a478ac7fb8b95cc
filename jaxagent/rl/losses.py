"""Pure loss functions of the four reimplemented systems, one per published variant.

Every function is pure `jax.numpy` (jit-able, with string options static), takes per-sample arrays with a
leading batch axis, and cites the formula it implements: the section of `reference/algorithms.md` (§) and
the original file it transcribes. Where the released code and the paper disagree (§6.4) the code's form is
the default (`*_code`) and the paper's form is an option (`*_paper` / `*_dr` / a `mode=` argument).

Conventions:
  * `logp_tok [B, T]` are per-token log-probabilities of the target action tokens, `mask [B, T]` is 1 on
    real tokens and 0 on padding.
  * Double critics are given as two arrays (head 1, head 2) or as a trailing head axis of size 2.
  * Values passed to advantage functions are scalars per sample (probabilities for classification heads,
    raw outputs for regression heads); `head_value` turns a head's raw output into that scalar.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

# The DigiRL / Digi-Q AutoUI policies clamp token probabilities before the log (§4.4, §4.14).
AUTOUI_PROB_CLAMP = (1e-3, 0.99)

_sg = jax.lax.stop_gradient


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
  if value not in choices:
    raise ValueError(f"{name}={value!r} is not one of {choices}")


# ------------------------------------------------------------------------------------ shared helpers


def sequence_logprob(logp_tok: jax.Array, mask: jax.Array, clamp_prob: tuple[float, float] | None = None
                     ) -> jax.Array:
  """log π(a|s) = Σ_t m_t · log clip(p_t, lo, hi)  →  [B].

  With `clamp_prob=(1e-3, 0.99)` this is DigiRL/Digi-Q's `get_log_prob` (§4.4;
  `digirl/models/autoui_agent.py:get_log_prob`, `digiq/models/autoui_agent.py:get_pi_theta_log_prob`:
  softmax → gather → `torch.clamp(p, 0.001, 0.99)` → log → × attention mask). Like `torch.clamp`, the
  clamp has zero gradient outside the range.
  """
  logp_tok = jnp.asarray(logp_tok, jnp.float32)
  if clamp_prob is not None:
    lo, hi = clamp_prob
    logp_tok = jnp.log(jnp.clip(jnp.exp(logp_tok), lo, hi))
  return _masked_sum(logp_tok, mask)


def _masked_sum(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Σ_t over real tokens; `where`, not `x * mask`, so a −inf log-prob on padding cannot turn into NaN."""
  return jnp.sum(jnp.where(jnp.asarray(mask) > 0, x, 0.0), axis=-1)


def bc_nll(logp_tok: jax.Array, mask: jax.Array, weights: jax.Array | None = None,
           clamp_prob: tuple[float, float] | None = None, normalize: str = "sequence") -> jax.Array:
  """Weighted behaviour-cloning negative log-likelihood (§6.2), shared by every actor that imitates.

  normalize="sequence" (DigiRL / Digi-Q / Filtered BC actor, §4.7, §5.5):
      L = − mean_b( w_b · Σ_t m_bt log p_bt )
    `digirl/algorithms/digirl/trainer.py:actor_loss` (`-torch.mean(log_prob.sum(1) * advantages)`),
    `digiq/algorithms/digiq/trainer.py:actor_loss` (same form, weights from Best-of-N).
  normalize="token" (OpenWebVoyager SFT, WebRL `actor_loss_sft`, §2.5, §3.8):
      L = − Σ_b w_b Σ_t m_bt log p_bt / Σ_bt m_bt
    `webrl/algorithms/webrl/trainer.py:actor_loss_sft` (`-log_prob.sum() / action_attention_mask.sum()`).
  `clamp_prob=(1e-3, 0.99)` reproduces the AutoUI probability clamp (`AUTOUI_PROB_CLAMP`).
  """
  _check_choice("normalize", normalize, ("sequence", "token"))
  mask = jnp.asarray(mask, jnp.float32)
  seq = sequence_logprob(logp_tok, mask, clamp_prob)
  w = jnp.ones_like(seq) if weights is None else jnp.asarray(weights, jnp.float32)
  if normalize == "sequence":
    return -jnp.mean(w * seq)
  return -jnp.sum(w * seq) / jnp.maximum(jnp.sum(mask), 1.0)


def head_value(out: jax.Array, learn_metric: str = "regression") -> jax.Array:
  """A head's raw output → a scalar value per sample.

  regression: the single output of `[..., 1]`; classification: softmax(logits)[..., 1], as every
  CE critic of the originals reads it (§3.7, §4.6, §5.4: `self.softmax(v)[:, 1]`).
  """
  _check_choice("learn_metric", learn_metric, ("regression", "classification"))
  want = 2 if learn_metric == "classification" else 1
  if out.ndim == 0 or out.shape[-1] != want:
    raise ValueError(f"head_value({learn_metric}): expected outputs [..., {want}], got shape {out.shape}")
  if learn_metric == "classification":
    return jax.nn.softmax(out, axis=-1)[..., 1]
  return out[..., 0]


def reduce_heads(values: jax.Array, how: str) -> jax.Array:
  """Aggregate a trailing double-head axis: `min` (DigiRL, WebRL: pessimistic, §4.7, §3.8) or `max` (Digi-Q code,
  §5.5: `torch.maximum(q1, q2)`, `digiq/algorithms/digiq/trainer.py:actor_loss`); `mean` for experiments."""
  _check_choice("head_reduce", how, ("min", "max", "mean"))
  return {"min": jnp.min, "max": jnp.max, "mean": jnp.mean}[how](values, axis=-1)


def value_ce(logits: jax.Array, label: jax.Array) -> jax.Array:
  """Binary value cross-entropy, mean over the batch: CE(logits [B,2], y ∈ {0,1} or soft y ∈ [0,1]).

  `torch.nn.CrossEntropyLoss()` on 2-way logits (§3.7, §4.6; `digirl/algorithms/digirl/trainer.py:
  trajectory_critic_loss` with y = 1[mc_return_last > 0]). A float label in [0,1] is a soft target
  (−(1−y) log p0 − y log p1), which equals the hard CE for y ∈ {0,1}.
  """
  y = jnp.asarray(label, jnp.float32)
  logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  return -jnp.mean((1.0 - y) * logp[..., 0] + y * logp[..., 1])


def value_ce_double(logits1: jax.Array, logits2: jax.Array, label: jax.Array) -> jax.Array:
  """CE(head1, y) + CE(head2, y) — one state's term of the double value critics (§3.7, §4.6).

  DigiRL's step critic and WebRL's critic apply it to s and to s' with the same label y = 1[G_t > 0]:
  `L = value_ce_double(h1(s), h2(s), y) + value_ce_double(h1(s'), h2(s'), y)`
  (`digirl/algorithms/digirl/trainer.py:critic_loss`, `webrl/algorithms/webrl/trainer.py:critic_loss`).
  """
  return value_ce(logits1, label) + value_ce(logits2, label)


def double_value_prob(logits1: jax.Array, logits2: jax.Array, reduce: str = "min") -> jax.Array:
  """V(s) = reduce(softmax(h1)[1], softmax(h2)[1]); DigiRL/WebRL use `min` (§4.7, §3.8;
  `digirl/algorithms/digirl/trainer.py:actor_loss`, `webrl/algorithms/webrl/trainer.py:actor_loss`:
  `torch.minimum(softmax(v1)[:, 1], softmax(v2)[:, 1])`)."""
  v = jnp.stack([head_value(logits1, "classification"), head_value(logits2, "classification")], -1)
  return reduce_heads(v, reduce)


# ------------------------------------------------------------------------------------------- Digi-Q


def digiq_td_targets(r: jax.Array, done: jax.Array, gamma: float, qbar1: jax.Array, qbar2: jax.Array,
                     vbar1_next: jax.Array, vbar2_next: jax.Array
                     ) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
  """Digi-Q's TD targets from the target critic (§5.4), gradients stopped:

      y_Q_i = r + (1 − done) · γ · V̄_i(s')        y_V_i = Q̄_i(s, a_b)        (i = 1, 2, head-paired)

  `digiq/algorithms/digiq/trainer.py:critic_loss` (advantage_estimation="bellman", γ = 0.95): Q_i regresses
  on the target V_i of s', V_i on the target Q_i of (s, a_b). Which action a_b backs V up is the caller's
  choice through `qbar*`: the code's default is the dataset action (`critc_use_original_action_to_backup`);
  the paper's J_V uses a ~ π_β (`digiq_backup_qbar(..., mode="sample" | "mean")`). Returns
  ((y_Q1, y_Q2), (y_V1, y_V2)).
  """
  notdone = 1.0 - jnp.asarray(done, jnp.float32)
  r = jnp.asarray(r, jnp.float32)
  yq1 = r + notdone * gamma * vbar1_next
  yq2 = r + notdone * gamma * vbar2_next
  return (_sg(yq1), _sg(yq2)), (_sg(jnp.asarray(qbar1)), _sg(jnp.asarray(qbar2)))


def digiq_mc_targets(mc_return: jax.Array, learn_metric: str = "regression") -> jax.Array:
  """Digi-Q's `advantage_estimation="mc"` target for all four heads (§5.4): G_t (regression) or 1[G_t > 0]
  (classification). `digiq/algorithms/digiq/trainer.py:critic_loss`, `elif self.advantage_estimation == "mc"`.
  """
  _check_choice("learn_metric", learn_metric, ("regression", "classification"))
  g = jnp.asarray(mc_return, jnp.float32)
  return _sg(g if learn_metric == "regression" else (g > 0).astype(jnp.float32))


def digiq_backup_qbar(qbar_cands: jax.Array, mode: str = "dataset", key: jax.Array | None = None
                      ) -> jax.Array:
  """Which target Q̄(s, ·) backs V up (§5.4), from the target critic's scores of all N candidates [B, N, ...].

  "dataset": index 0, the dataset action (code default, `critc_use_original_action_to_backup=True`).
  "sample":  one candidate index drawn uniformly and shared by the batch, as the code's other branch
             (`random.choice(range(num_actions))` then `q_rep_out_list[:, idx]`) — the paper's a ~ π_β.
  "mean":    the expectation over the stored π_β candidates, E_{a~π_β} Q̄(s, a) of the paper's J_V.
  """
  _check_choice("mode", mode, ("dataset", "sample", "mean"))
  if mode == "dataset":
    return qbar_cands[:, 0]
  if mode == "mean":
    return jnp.mean(qbar_cands, axis=1)
  if key is None:
    raise ValueError("digiq_backup_qbar(mode='sample') needs a PRNG `key`")
  idx = jax.random.randint(key, (), 0, qbar_cands.shape[1])
  return jnp.take(qbar_cands, idx, axis=1)


def _head_loss(pred: jax.Array, target: jax.Array, learn_metric: str) -> jax.Array:
  if learn_metric == "regression":
    pred = pred[..., 0] if pred.ndim and pred.shape[-1] == 1 else pred
    return jnp.mean((pred - target) ** 2)  # torch.nn.MSELoss()
  return value_ce(pred, target)  # torch.nn.CrossEntropyLoss() (soft target for TD, see digiq_critic_loss)


def digiq_critic_loss(q1: jax.Array, q2: jax.Array, v1: jax.Array, v2: jax.Array,
                      y_q: tuple[jax.Array, jax.Array], y_v: tuple[jax.Array, jax.Array],
                      learn_metric: str = "regression") -> tuple[jax.Array, dict[str, jax.Array]]:
  """L = ℓ(Q1, y_Q1) + ℓ(Q2, y_Q2) + ℓ(V1, y_V1) + ℓ(V2, y_V2)   (§5.4, `digiq/.../trainer.py:critic_loss`).

  regression (code default `learn_metric: regression`): ℓ = MSE, heads output [B, 1] or [B].
  classification: ℓ = 2-way cross-entropy on logits [B, 2]. The targets are probabilities: 1[G > 0] for
  the mc targets; for TD targets, y ∈ [0, 1] from the target heads' softmax[1] (pass
  `head_value(·, "classification")` of the target outputs) used as a soft label. (The original's
  bellman + classification path flattens [B, 2] target logits and is not well defined; this is the
  natural reading and is documented as ours.)
  Returns (loss, per-head losses for logging).
  """
  _check_choice("learn_metric", learn_metric, ("regression", "classification"))
  parts = {
      "q1_loss": _head_loss(q1, y_q[0], learn_metric),
      "q2_loss": _head_loss(q2, y_q[1], learn_metric),
      "v1_loss": _head_loss(v1, y_v[0], learn_metric),
      "v2_loss": _head_loss(v2, y_v[1], learn_metric),
  }
  return sum(parts.values()), parts


def best_of_n_candidate_ids(key: jax.Array, n_stored: int, n: int, include_index0: bool = True
                            ) -> jax.Array:
  """The candidate subset scored per batch (§5.5): `ids = random.sample(range(N_stored), n); ids[0] = 0`.

  `digiq/algorithms/digiq/trainer.py:actor_loss` (`actor_always_include_original_action`). Like the code,
  index 0 may then appear twice when it was also sampled elsewhere.
  """
  if n > n_stored:
    raise ValueError(f"best_of_n_candidate_ids: n={n} > n_stored={n_stored}; lower num_action_resampling")
  ids = jax.random.permutation(key, n_stored)[:n]
  return ids.at[0].set(0) if include_index0 else ids


def best_of_n_select(q: jax.Array, v: jax.Array, valid: jax.Array, head_reduce: str = "max",
                     include_index0: bool = True) -> tuple[jax.Array, jax.Array]:
  """Best-of-N re-ranking of candidate actions (§5.5), returns (k* [B], Adv_k* [B]):

      Adv_k = reduce_i Q_i(s, a_k) − reduce_i V_i(s);   Adv_k = 0 if a_k is invalid;   k* = argmax_k Adv_k

  q: [B, N] or [B, N, H] per-head values (H = 2 double heads, reduced by `head_reduce`: the code's `max`,
  or `min`); v: [B] or [B, H]; valid: [B, N] bool. `digiq/algorithms/digiq/trainer.py:actor_loss`
  (`torch.maximum(q1, q2) - torch.maximum(v1, v2)`, `advantage[b] = 0` for `not is_action_valid`,
  `argmax(dim=1)`; ties go to the lowest index, as in torch). The returned advantage is unclamped;
  `best_of_n_weights` clamps it. With `include_index0=False` the dataset action (index 0) is left out of
  the argmax, so only policy samples compete (the paper's a_i ~ π_β).
  """
  q = jnp.asarray(q, jnp.float32)
  v = jnp.asarray(v, jnp.float32)
  if q.ndim == 3:
    q = reduce_heads(q, head_reduce)
  if v.ndim == 2:
    v = reduce_heads(v, head_reduce)
  if q.ndim != 2 or v.ndim != 1 or valid.shape != q.shape:
    raise ValueError(f"best_of_n_select: expected q [B,N(,H)], v [B(,H)], valid [B,N]; got q {q.shape}, "
                     f"v {v.shape}, valid {valid.shape}")
  adv = jnp.where(valid, q - v[:, None], 0.0)
  scores = adv if include_index0 else adv.at[:, 0].set(-jnp.inf)
  idx = jnp.argmax(scores, axis=1)
  return idx, jnp.take_along_axis(adv, idx[:, None], axis=1)[:, 0]


def best_of_n_weights(adv: jax.Array, kind: str = "best-of-n", threshold: float = 0.10,
                      pg_multiplier: float = 5.0, awr_beta: float = 0.01) -> jax.Array:
  """Per-sample actor weights from the selected advantage (§5.5), with A = clamp(Adv_k*, 0, 1):

      best-of-n: w = 1[A > thr]  (thr 0.10 general, 0.05 webshop)     pg:  w = A · pg_multiplier
      awr:       w = exp(A / awr_beta)                                 sft: w = 1

  `digiq/algorithms/digiq/trainer.py:actor_loss` (`actor_loss_type`). The actor loss is then
  `bc_nll(logp_tok(a*), mask, w, clamp_prob=AUTOUI_PROB_CLAMP)`.
  """
  _check_choice("kind", kind, ("best-of-n", "pg", "awr", "sft"))
  a = jnp.clip(_sg(jnp.asarray(adv, jnp.float32)), 0.0, 1.0)
  if kind == "best-of-n":
    return (a > threshold).astype(jnp.float32)
  if kind == "pg":
    return a * pg_multiplier
  if kind == "awr":
    return jnp.exp(a / awr_beta)
  return jnp.ones_like(a)


# ------------------------------------------------------------------------------------------- DigiRL


def digirl_advantage_code(v: jax.Array, v_next: jax.Array, r: jax.Array, mc_return: jax.Array,
                          c: float = 0.05) -> jax.Array:
  """A = V(s') − V(s) − c + r + G_t   (§4.7; `digirl/algorithms/digirl/trainer.py:actor_loss`).

  v, v_next: min over the double step-critic of softmax[1] (`double_value_prob(..., "min")`), no grad.
  The sum (not a convex mix) is what the code runs; c = 0.05 plays the paper's 1/H threshold.
  """
  return _sg(v_next - v - c + r + mc_return)


def digirl_weights_code(adv: jax.Array) -> jax.Array:
  """w = 1[clamp(A, 0, 1) > 0]   (§4.7; `digirl/algorithms/digirl/trainer.py:actor_loss`:
  `(torch.clamp(advantage, 0, 1) > 0)`) — the hard filter of DigiRL's 'AWR'."""
  return (jnp.clip(_sg(adv), 0.0, 1.0) > 0).astype(jnp.float32)


def digirl_advantage_dr(v: jax.Array, v_next: jax.Array, r: jax.Array, r_final: jax.Array, lam: float,
                        horizon: int | jax.Array, h: jax.Array) -> jax.Array:
  """The paper's doubly-robust step advantage (§4.6, [recall]):

      A(s_h, a_h) = λ^{H−h} · r(s_H, a_H) + (1 − λ^{H−h}) · (V(s_{h+1}) + r(s_h, a_h) − V(s_h))
  """
  decay = jnp.power(lam, jnp.asarray(horizon, jnp.float32) - jnp.asarray(h, jnp.float32))
  return _sg(decay * r_final + (1.0 - decay) * (v_next + r - v))


def digirl_weights_dr(adv: jax.Array, horizon: int) -> jax.Array:
  """The paper's hard filter w = 1[A > 1/H] (§4.6)."""
  return (_sg(adv) > 1.0 / horizon).astype(jnp.float32)


def topk_quantile_filter(scores: jax.Array, q: float = 0.9) -> jax.Array:
  """Keep items with score ≥ quantile_q(scores) (linear interpolation, as `np.quantile`) → bool mask.

  DigiRL's trajectory filters (§4.7): `filterbc_buffer` scores by trajectory reward, `filter_buffer` by
  reward − V^inst (`digirl/algorithms/offpolicy_train_loop.py`). Quirk kept on purpose: with 0/1 rewards and
  fewer than ~10% successes the 0.9-quantile is 0, so every trajectory (failures too) is kept.
  """
  scores = jnp.asarray(scores, jnp.float32)
  return scores >= jnp.quantile(scores, q)


# -------------------------------------------------------------------------------------------- WebRL


def webrl_advantage_code(v: jax.Array, v_next: jax.Array, r: jax.Array, mc_return: jax.Array,
                         c: float = 0.05) -> jax.Array:
  """A = clamp(V(s') − V(s) − c + r + G_t, −1, 1)   (§3.8; `webrl/algorithms/webrl/trainer.py:actor_loss`).

  v, v_next = min over the two critic heads of softmax[1]; r is the trajectory score repeated on every step.
  """
  return _sg(jnp.clip(v_next - v - c + r + mc_return, -1.0, 1.0))


WEBRL_NORMALIZE = ("sample", "batch")


def webrl_actor_loss_code(logp_tok: jax.Array, ref_logp_tok: jax.Array, mask: jax.Array, adv: jax.Array,
                          add_sft_loss: bool = False, normalize: str = "sample"
                          ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """WebRL's actor loss as run (§3.8 pseudo-code; `webrl/algorithms/webrl/trainer.py:actor_loss`, l.151-215):

      Â = +1 if A ≥ 0 else −0.6;  lp = Σ_t m log π_θ;  lp_ref = Σ_t m log π_ref;  p_ref = exp(lp_ref / n)
      β0 = 5 if (Â ≥ 0 and p_ref ≥ 0.8) or (Â < 0 and p_ref < 0.9) else 1;  mask = 1[Â > 0]
      N = max(Σ_{masked} n, 1);  ρ = (lp − lp_ref) / N;  β = sg(min(β0, |Â / ρ|))
      L = mean( (1/β) · SmoothL1_δ=1(β ρ, Â) · mask )  [+ Σ_masked −lp · exp(1 − exp(lp/n)) / N]

  The code runs it on a batch of one per device (`batch_size: 1`, `scripts/config/main/webrl.yaml`; DDP and
  gradient accumulation average the per-sample losses), so N is each sample's own token count (1 for a
  masked-out one, whose loss is 0) and L the mean over the batch of each sample's: `normalize="sample"`, the
  default. `normalize="batch"` takes N over the whole batch's kept samples, the formula read at a batch size the
  original never ran (a smaller ρ, so another β and smaller gradients). `adv` is the clamped advantage of
  `webrl_advantage_code`. Returns (loss, diagnostics).
  """
  return webrl_actor_loss_code_seq(logp_tok, mask, _masked_sum(ref_logp_tok, mask), adv, add_sft_loss, normalize)


def webrl_actor_loss_code_seq(logp_tok: jax.Array, mask: jax.Array, ref_logp: jax.Array, adv: jax.Array,
                              add_sft_loss: bool = False, normalize: str = "sample"
                              ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`webrl_actor_loss_code` with the reference policy's summed log-probability `ref_logp` [B] = Σ_t m log π_ref
  given per sample (the only form of π_ref the loss reads), so a trainer can score the reference once, before
  training, instead of running it beside the actor."""
  _check_choice("normalize", normalize, WEBRL_NORMALIZE)
  mask = jnp.asarray(mask, jnp.float32)
  adv_hat = jnp.where(_sg(adv) >= 0, 1.0, -0.6)
  n_tok = jnp.sum(mask, axis=-1)
  lp = _masked_sum(logp_tok, mask)
  lp_ref = _sg(jnp.asarray(ref_logp, jnp.float32))
  p_ref = jnp.exp(lp_ref / n_tok)
  beta0 = jnp.where(((adv_hat >= 0) & (p_ref >= 0.8)) | ((adv_hat < 0) & (p_ref < 0.9)), 5.0, 1.0)
  sample_mask = (adv_hat > 0).astype(jnp.float32)
  count = n_tok * sample_mask if normalize == "sample" else jnp.sum(n_tok * sample_mask)
  safe_count = jnp.where(count > 0, count, 1.0)
  rho = (lp - lp_ref) / safe_count
  beta = _sg(jnp.minimum(beta0, jnp.abs(adv_hat / rho)))
  per_sample = optax.huber_loss(beta * rho, adv_hat, delta=1.0)  # torch.nn.SmoothL1Loss (beta=1)
  loss = jnp.mean(per_sample / beta * sample_mask)
  if add_sft_loss:
    sft = -lp * jnp.exp(1.0 - jnp.exp(_sg(lp) / n_tok)) * sample_mask / safe_count
    loss = loss + (jnp.mean(sft) if normalize == "sample" else jnp.sum(sft))
  aux = {"advantage_hat": adv_hat, "beta": beta, "log_ratio": rho, "ref_prob": p_ref, "mask": sample_mask}
  return loss, aux


def webrl_actor_loss_paper(beta: float, logp: jax.Array, ref_logp: jax.Array, adv: jax.Array) -> jax.Array:
  """The paper's KL-constrained regression (§3.8, [recall]):

      L = mean( (β · log(π_θ(a|s) / π_ref(a|s)) − A)² )      with sequence log-probs logp, ref_logp [B].
  """
  return jnp.mean((beta * (logp - _sg(ref_logp)) - _sg(adv)) ** 2)


def webrl_rank_score(logp_tok: jax.Array, mask: jax.Array) -> jax.Array:
  """rank_score = exp(Σ_t log π(a_t|s))^(1/n) — geometric-mean token probability = 1/perplexity
  (§3.9; `scripts/process_data.py:process_data_chunk`)."""
  mask = jnp.asarray(mask, jnp.float32)
  return jnp.exp(_masked_sum(logp_tok, mask) / jnp.maximum(jnp.sum(mask, -1), 1.0))


def perplexity_replay_filter(rank_score: jax.Array, lo: float = 0.5, hi: float = 0.95) -> jax.Array:
  """Keep replayed successful steps with lo < rank_score ≤ hi (§3.9; `scripts/process_data.py:replay_data`),
  i.e. perplexity in [1/0.95, 2): neither too familiar nor too surprising to the current actor. The
  2 × |current phase| cap is a host-side shuffle-and-truncate done by the replay buffer."""
  rank_score = jnp.asarray(rank_score)
  return (rank_score > lo) & (rank_score <= hi)



# ------------------------------------------------------------------------- group-relative policy optimisation
#
# Online RL beyond the seeds (`configs/grpo.py`): G rollouts of each task from identical resets form a group, and
# each rollout's advantage is its return against the group's (no critic). Group ids are integers in [0, groups);
# the statistics follow verl's `compute_grpo_outcome_advantage` and verl-agent's GiGPO (`core_gigpo.py`): the
# standard deviation is the unbiased one (torch.std), a group of one has mean 0 and std 1, ε = 1e-6.


def _group_stats(x: jax.Array, group_ids: jax.Array, num_groups: int) -> tuple[jax.Array, jax.Array]:
  """Per-element (mean, unbiased std) of its group; a group of one gives (0, 1)."""
  x = jnp.asarray(x, jnp.float32)
  ids = jnp.asarray(group_ids, jnp.int32)
  n = jax.ops.segment_sum(jnp.ones_like(x), ids, num_groups)
  mean = jax.ops.segment_sum(x, ids, num_groups) / jnp.maximum(n, 1.0)
  sq = jax.ops.segment_sum((x - mean[ids]) ** 2, ids, num_groups)
  std = jnp.sqrt(sq / jnp.maximum(n - 1.0, 1.0))
  single = n[ids] < 2
  return jnp.where(single, 0.0, mean[ids]), jnp.where(single, 1.0, std[ids])


def grpo_advantages(returns: jax.Array, group_ids: jax.Array, num_groups: int, scale: str = "std",
                    eps: float = 1e-6) -> jax.Array:
  """The trajectory-level group-relative advantage, one per rollout [N].

  scale="std" (GRPO, Shao et al. 2024, arXiv:2402.03300 §4.1.2): Â_i = (R_i − mean_g R) / (std_g R + ε).
  scale="none" (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783 §3.1): Â_i = R_i − mean_g R, without the division
  that weights groups of near-equal returns up (the "question-level difficulty bias").
  """
  _check_choice("scale", scale, ("std", "none"))
  r = jnp.asarray(returns, jnp.float32)
  mean, std = _group_stats(r, group_ids, num_groups)
  adv = r - mean
  return _sg(adv / (std + eps) if scale == "std" else adv)


def gigpo_step_advantages(step_returns: jax.Array, anchor_ids: jax.Array, num_anchors: int, scale: str = "none",
                          eps: float = 1e-6) -> jax.Array:
  """GiGPO's step-level advantage (Feng et al. 2025, arXiv:2505.10978, Eq. 7), one per step [M].

  Steps of one task's group that act on the same state (the anchor: an identical observation, `anchor_ids`) form a
  step group; each step's discounted return from there, `step_returns` (γ-discounted, γ = 0.95 in the paper), is
  compared with its step group's: Â^S = R_t − mean (scale="none", the paper's mean_norm default) or
  (R_t − mean) / (std + ε) (scale="std"). A state visited once has no peer: Â^S = R_t − 0, as verl-agent does.
  The step's advantage is then Â^E + ω Â^S with the episode-level `grpo_advantages` (`gigpo_advantages`).
  """
  return grpo_advantages(step_returns, anchor_ids, num_anchors, scale, eps)


def gigpo_advantages(episode_adv: jax.Array, step_adv: jax.Array, step_weight: float = 1.0) -> jax.Array:
  """Â = Â^E + ω · Â^S per step (GiGPO Eq. 8; verl-agent `step_advantage_w`, 1.0): `episode_adv` is the step's
  episode's `grpo_advantages`, repeated on its steps."""
  return _sg(jnp.asarray(episode_adv, jnp.float32) + step_weight * jnp.asarray(step_adv, jnp.float32))


def k3_kl(logp_tok: jax.Array, ref_logp_tok: jax.Array) -> jax.Array:
  """Per-token KL(π_θ ‖ π_ref) estimate k3 = exp(q) − q − 1 with q = log π_ref − log π_θ on tokens sampled from
  π_θ: unbiased and ≥ 0 (Schulman 2020, "Approximating KL divergence"; GRPO's Eq. 4; verl's `low_var_kl`, whose
  clamp to [−10, 10] is kept)."""
  q = jnp.asarray(ref_logp_tok, jnp.float32) - jnp.asarray(logp_tok, jnp.float32)
  return jnp.clip(jnp.exp(q) - q - 1.0, -10.0, 10.0)


def aggregate_tokens(x: jax.Array, mask: jax.Array, agg: str = "token_mean", norm_len: float | None = None
                     ) -> jax.Array:
  """Reduce per-token losses [B, T] to a scalar.

  token_mean:              Σ_bt m x / Σ_bt m (DAPO, Yu et al. 2025, arXiv:2503.14476 Eq. 12; verl's default).
  seq_mean_token_mean:     mean_b (Σ_t m x / Σ_t m) (GRPO as published, Eq. 3: long replies weigh less per token).
  seq_mean_token_sum_norm: mean_b (Σ_t m x) / `norm_len` (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783: a constant
                           in place of each length, the generation budget: oat's `masked_sum(...,
                           constant_normalizer=generate_max_length)`; required, since verl's fallback, the padded
                           length T, changes with every batch's longest sequence).
  """
  _check_choice("agg", agg, ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"))
  if agg == "seq_mean_token_sum_norm" and not (norm_len and norm_len > 0):
    raise ValueError(f"agg='seq_mean_token_sum_norm' divides by a fixed generation budget; norm_len={norm_len!r} "
                     "must be > 0 (the sampler's max_tokens)")
  mask = jnp.asarray(mask, jnp.float32)
  per_seq = _masked_sum(x, mask)
  if agg == "token_mean":
    return jnp.sum(per_seq) / jnp.maximum(jnp.sum(mask), 1.0)
  if agg == "seq_mean_token_mean":
    return jnp.mean(per_seq / jnp.maximum(jnp.sum(mask, -1), 1.0))
  return jnp.mean(per_seq) / float(norm_len)


def ppo_clip_loss(logp_tok: jax.Array, old_logp_tok: jax.Array, adv: jax.Array, mask: jax.Array,
                  clip_low: float = 0.2, clip_high: float = 0.2, behaviour_logp_tok: jax.Array | None = None,
                  behaviour_weight_cap: float | None = None, agg: str = "token_mean",
                  ref_logp_tok: jax.Array | None = None, kl_coef: float = 0.0, norm_len: float | None = None
                  ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The clipped surrogate on sequences' tokens, the policy loss of GRPO, Dr. GRPO and GiGPO:

      ρ_t = π_θ(a_t) / π_old(a_t),   L = agg( −min(ρ_t Â, clip(ρ_t, 1 − ε_lo, 1 + ε_hi) Â) · w_t + β k3_t )

  (PPO, Schulman et al. 2017, arXiv:1707.06347 Eq. 7; the asymmetric ε of DAPO; β k3 to the reference policy as
  GRPO's Eq. 3 when `ref_logp_tok` is given). `adv` [B] is one advantage per sequence.

  Decoupled PPO (Hilton et al. 2021, arXiv:2110.00641; AReaL, Fu et al. 2025, arXiv:2505.24298 Eq. 5) when
  `behaviour_logp_tok` is given: the rollout was sampled by a lagged policy π_behav, `old_logp_tok` is the proximal
  policy (the weights at the start of this update), and each token carries w_t = π_prox / π_behav (no gradient),
  capped at `behaviour_weight_cap` (tokens above it are dropped, as AReaL's `behav_imp_weight_cap`). Without it,
  w_t = 1 and π_old is the sampler's. `agg` and `norm_len`: `aggregate_tokens`. Returns (loss, diagnostics).
  """
  logp = jnp.asarray(logp_tok, jnp.float32)
  old = _sg(jnp.asarray(old_logp_tok, jnp.float32))
  mask = jnp.asarray(mask, jnp.float32)
  a = _sg(jnp.asarray(adv, jnp.float32))[:, None]
  ratio = jnp.exp(jnp.where(mask > 0, logp - old, 0.0))
  clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  per_tok = -jnp.minimum(ratio * a, clipped * a)
  if behaviour_logp_tok is not None:
    w = jnp.exp(jnp.where(mask > 0, old - _sg(jnp.asarray(behaviour_logp_tok, jnp.float32)), 0.0))
    if behaviour_weight_cap is not None:
      mask = mask * (w <= behaviour_weight_cap)
    per_tok = per_tok * w
  kl = jnp.zeros_like(logp) if ref_logp_tok is None else k3_kl(logp, _sg(jnp.asarray(ref_logp_tok, jnp.float32)))
  loss = aggregate_tokens(per_tok + kl_coef * kl, mask, agg, norm_len)
  m = jnp.maximum(jnp.sum(mask), 1.0)
  aux = {"clip_fraction": _masked_sum(((ratio * a) > (clipped * a)).astype(jnp.float32), mask).sum() / m,
         "ratio_mean": _masked_sum(ratio, mask).sum() / m,
         "kl": _masked_sum(kl, mask).sum() / m}
  return loss, aux
