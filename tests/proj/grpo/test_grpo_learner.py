"""The GRPO learner and groups without a browser: updates move the sampled replies' log-probs in the direction of
their advantages, the policy acts with the new weights, lagged rounds take the decoupled path, and advantages are
the group-relative ones."""

import os

import numpy as np
import pytest

from jaxagent import types
from jaxagent.main import load_config_file
from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.policy import load
from jaxagent.proj.grpo import groups
from jaxagent.proj.grpo.learner import Learner, process_rows, token_batch

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs", "grpo.py")


@pytest.fixture(scope="module")
def start(tmp_path_factory):
  config = load_config_file(f"{CONFIG}:smoke")
  config.data.tokenizer = ""
  config.grpo.kl_coef = 0.01
  config.grpo.optim.lr = 3e-3
  config.grpo.epochs = 4
  out = str(tmp_path_factory.mktemp("il"))
  items = [{"id": f"s{i}", "conversations": [{"from": "human", "value": f"Click the button number {i}."},
                                              {"from": "gpt", "value": f"click {i}"}]} for i in range(4)]
  finetune(stage_config(config, config.il, steps=2), out, items, agent=None)
  return config, out


def _logp(policy, prompt, reply_ids):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  ids = jnp.asarray([prompt + reply_ids], jnp.int32)
  logits = policy.loaded.model(ids, attention_mask=jnp.ones_like(ids, bool))[0]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  return float(sum(logp[len(prompt) - 1 + i, t] for i, t in enumerate(reply_ids)))


@pytest.mark.slow
@pytest.mark.parametrize("lagged", [False, True])
def test_updates_follow_the_advantages_and_reach_the_acting_policy(start, tmp_path, lagged):
  config, il = start
  policy = load(il, temperature=1.0, fmt="webrl", max_tokens=8, seed=1)
  replies = policy.generate([("Click the button number 1.", [])] * 2)
  good, bad = replies
  assert good.reply_ids != bad.reply_ids
  rows = [{"prompt_ids": r.prompt_ids, "reply_ids": r.reply_ids, "logprobs": r.logprobs, "advantage": a}
          for r, a in ((good, 1.0), (bad, -1.0))]
  learner = Learner(config, stage_config(config, config.grpo), il, str(tmp_path / "actor"), policy.fmt)
  try:
    before = [_logp(policy, good.prompt_ids, good.reply_ids), _logp(policy, bad.prompt_ids, bad.reply_ids)]
    snapshot = learner.weights()  # a lagged round acts with weights taken before later updates
    metrics = learner.update(rows, lagged=lagged, seed=0)
    policy.set_weights(snapshot)  # still alive after the update donated the learner's buffers
    assert _logp(policy, good.prompt_ids, good.reply_ids) == pytest.approx(before[0], abs=1e-5)
    assert metrics["updates"] == 4 and metrics["samples"] == 2 and np.isfinite(metrics["loss"])
    assert metrics["kl"] >= 0
    policy.set_weights(learner.weights())
    after = [_logp(policy, good.prompt_ids, good.reply_ids), _logp(policy, bad.prompt_ids, bad.reply_ids)]
    assert after[0] > before[0] and after[1] < before[1]
    learner.end_round(1, metrics, force=True)
  finally:
    learner.close()
  assert os.listdir(tmp_path / "actor" / "checkpoints") == ["1"]
  reloaded = load(str(tmp_path / "actor"), temperature=1.0)
  assert _logp(reloaded, good.prompt_ids, good.reply_ids) == pytest.approx(after[0], abs=1e-4)


@pytest.mark.slow
def test_rows_with_zero_advantage_do_not_train(start, tmp_path):
  config, il = start
  learner = Learner(config, stage_config(config, config.grpo), il, str(tmp_path / "actor"),
                    load(il, temperature=1.0, fmt="webrl").fmt)
  try:
    assert learner.update([{"prompt_ids": [1, 2], "reply_ids": [3], "logprobs": [-1.0], "advantage": 0.0}],
                          lagged=False, seed=0) == {"updates": 0, "samples": 0}
  finally:
    learner.close()


def test_token_batch_aligns_the_reply_with_its_targets():
  batch = token_batch([{"prompt_ids": [5, 6, 7], "reply_ids": [8, 9], "logprobs": [-0.5, -0.25], "advantage": 2.0}],
                      8, pad_id=0)
  assert batch["input_ids"][0].tolist() == [5, 6, 7, 8, 0, 0, 0, 0]
  assert batch["targets"][0, :4].tolist() == [6, 7, 8, 9]
  assert batch["loss_mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]  # position 2 predicts 8, position 3 predicts 9
  assert batch["behaviour_logp"][0, 2:4].tolist() == [-0.5, -0.25] and batch["advantage"][0] == 2.0
  with pytest.raises(ValueError, match="the batch holds 8"):
    token_batch([{"prompt_ids": list(range(9)), "reply_ids": [1], "logprobs": [0.0], "advantage": 1.0}], 8, 0)


def _traj(task_id, rewards, prompts):
  task = types.Task(id=task_id, intent="x", site="miniwob", start_url="")
  return types.Trajectory(task, [types.Step(step=i, obs_text=p, reward=r) for i, (r, p) in
                                 enumerate(zip(rewards, prompts))], status="completed")


@pytest.mark.slow
def test_step_advantages_are_group_relative_and_gigpo_groups_identical_states():
  eps = groups.group_episodes([types.Task(id="t", intent="", site="miniwob", start_url="")], 2, 3)
  assert [e.id for e in eps] == ["t@r3g0", "t@r3g1"] and groups.group_of(eps[1].id) == "t@r3"
  trajs = [_traj("t@r3g0", [0.0, 1.0], ["s0", "s1"]), _traj("t@r3g1", [0.0, -1.0], ["s0", "s2"]),
           _traj("u@r3g0", [1.0], ["u0"]), _traj("u@r3g1", [1.0], ["u0"])]
  adv = groups.step_advantages(trajs, "dr_grpo")
  assert [a.tolist() for a in adv] == [[1.0, 1.0], [-1.0, -1.0], [0.0], [0.0]]
  gi = groups.step_advantages(trajs, "gigpo", gamma=0.5)
  ep = groups.step_advantages(trajs, "grpo")[0][0]
  # step 0 of both rollouts acts on s0: returns 0.5 and -0.5 -> +-0.5; steps 1 are singletons: R - 0
  np.testing.assert_allclose(gi[0], [ep + 0.5, ep + 1.0], rtol=1e-5)
  np.testing.assert_allclose(gi[1], [-ep - 0.5, -ep - 1.0], rtol=1e-5)
  assert groups.identical_resets(trajs) == 1.0
  assert groups.identical_resets([_traj("t@r1g0", [0.0], ["a"]), _traj("t@r1g1", [0.0], ["b"])]) == 0.0
  with pytest.raises(ValueError, match="advantage"):
    groups.step_advantages(trajs, "ppo")


def test_each_process_feeds_its_contiguous_share_of_a_minibatch():
  idx = np.array([7, 3, 5, 1, 0, 2])
  shares = [process_rows(idx, p, 3).tolist() for p in range(3)]
  assert shares == [[7, 3], [5, 1], [0, 2]]  # in process order: what put_batch places on each process's devices
  assert process_rows(idx, 0, 1).tolist() == idx.tolist()
  with pytest.raises(ValueError, match="grpo.train.batch_size=6 does not split over 4 processes"):
    process_rows(idx, 0, 4)


def test_the_success_reward_ranks_a_time_out_with_a_wrong_end():
  """MiniWoB++'s own reward puts a time-out (0) above a wrong end (−1); the judge's outcome does not."""
  wrong, timeout, won = (_traj(f"t@r1g{k}", r, ["s"] * len(r)) for k, r in enumerate(([-1.0], [0.0, 0.0], [1.0])))
  won.success, wrong.success, timeout.success = 1.0, 0.0, 0.0
  env = groups.step_advantages([wrong, timeout, won], "dr_grpo")
  success = groups.step_advantages([wrong, timeout, won], "dr_grpo", reward="success")
  assert env[1][0] > env[0][0] and success[1][0] == success[0][0] < success[2][0]
  assert groups.step_rewards(timeout, "success").tolist() == [0.0, 0.0]
  assert groups.step_rewards(won, "success").tolist() == [1.0] and groups.episode_return(wrong, "success") == 0.0
  gi = groups.step_advantages([wrong, timeout, won], "gigpo", reward="success")
  assert gi[0][0] == gi[1][0]  # the step-level term sees the same rewards
  with pytest.raises(ValueError, match="reward"):
    groups.step_rewards(won, "raw")


def _self_scored_rows(learner, rows, length):
  """`token_batch` of `rows` whose behaviour log-probs are the learner's own (ratio 1: the loss is −Â per token)."""
  arrays = token_batch(rows, length, learner.pad_id)
  arrays["behaviour_logp"] = learner._scored(learner.ts.model(), arrays, len(rows))
  return arrays


@pytest.mark.slow
def test_dr_grpo_divides_by_the_generation_budget_whatever_the_rounds_lengths(start, tmp_path):
  """Dr. GRPO's loss = mean_b(Σ_t −Â_b) / sampling.max_tokens at ratio 1 and zero KL, by hand: the same in a batch
  padded to 64 as to 128 tokens (the padded length, its old divisor, changes with each round's longest step)."""
  config, il = start
  config = config.copy_and_resolve_references()
  config.grpo.loss_agg = "seq_mean_token_sum_norm"
  learner = Learner(config, stage_config(config, config.grpo), il, str(tmp_path / "actor"),
                    load(il, temperature=1.0, fmt="webrl").fmt)
  rows = [{"prompt_ids": [5, 6, 7], "reply_ids": [8, 9], "logprobs": [0.0, 0.0], "advantage": 1.5},
          {"prompt_ids": [5, 6], "reply_ids": [10, 11, 12], "logprobs": [0.0, 0.0, 0.0], "advantage": -0.5}]
  by_hand = -(1.5 * 2 + -0.5 * 3) / 2 / config.sampling.max_tokens  # = −0.75 / 16 with smoke's budget
  try:
    for length in (64, 128):
      loss, aux = learner._loss(learner.ts.model(), _self_scored_rows(learner, rows, length), None)
      assert float(aux["kl"]) == pytest.approx(0.0, abs=1e-6)  # the reference is the start
      assert float(loss) == pytest.approx(by_hand, rel=1e-4), length
  finally:
    learner.close()


@pytest.mark.slow
def test_a_step_longer_than_data_seq_len_trains_rather_than_failing_after_the_rollouts(start, tmp_path):
  """The sampler takes prompts up to the model's context; the learner takes the round's longest step, whatever
  `data.seq_len` (IL's training length) says."""
  config, il = start
  stage = stage_config(config, config.grpo)
  stage.data.seq_len = 64
  learner = Learner(config, stage, il, str(tmp_path / "actor"), load(il, temperature=1.0, fmt="webrl").fmt)
  try:
    long_prompt = [5 + i % 40 for i in range(90)]
    metrics = learner.update([{"prompt_ids": long_prompt, "reply_ids": [8, 9], "logprobs": [-1.0, -1.0],
                               "advantage": 1.0}], lagged=False, seed=0)
    assert metrics["updates"] > 0 and np.isfinite(metrics["loss"])
  finally:
    learner.close()
