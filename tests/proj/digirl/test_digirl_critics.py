"""DigiRL's critic targets, advantage and filters against hand-computed values (`reference/algorithms.md` §4.6–4.7)."""

import numpy as np
import pytest

from jaxagent import types
from jaxagent.agents import autoui
from jaxagent.proj.digirl import critics

TAP = 'Action Plan: [DUAL_POINT] ; Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.5000, 0.2500]", ' \
      '"lift_point": "[0.5000, 0.2500]", "typed_text": ""'


def _traj(goal: str, n: int, success: float) -> types.Trajectory:
  task = types.Task(id=goal, intent=goal, site="shop", start_url="http://localhost/")
  steps = []
  for k in range(n):
    history = [autoui.autoui_translate_action(TAP)] * min(k, 1)
    steps.append(types.Step(step=k, obs_text=autoui.autoui_prepare_prompt(goal, history), action_text=TAP,
                            action=autoui.autoui_translate_action(TAP)))
  return types.Trajectory(task, steps, success=success)


def test_returns_are_the_discounted_terminal_reward():
  r, g = critics.returns(_traj("a", 3, 1.0), 0.5)
  np.testing.assert_allclose(r, [0, 0, 1])
  np.testing.assert_allclose(g, [0.25, 0.5, 1.0])  # G_t = 0.5^{T-1-t} (`add_mc_return`)
  r, g = critics.returns(_traj("b", 2, 0.0), 0.5)
  np.testing.assert_allclose(g, [0, 0])


def test_step_rows_frame_stack_and_label_every_step_by_the_outcome():
  trajs = [_traj("win", 2, 1.0), _traj("lose", 1, 0.0)]
  screens = [np.array([[1.0], [2.0], [3.0]]), np.array([[7.0], [8.0]])]  # T + 1 features each
  rows = critics.step_arrays(trajs, screens, text_dim=16, gamma=0.5)
  np.testing.assert_array_equal(rows["index"], [[0, 0], [0, 1], [1, 0]])
  # f_{-1} := f_0; s = [f_{t-1} ‖ f_t], s' = [f_t ‖ f_{t+1}] (`framestack`)
  np.testing.assert_array_equal(rows["image"], [[1, 1], [1, 2], [7, 7]])
  np.testing.assert_array_equal(rows["next_image"], [[1, 2], [2, 3], [7, 8]])
  np.testing.assert_array_equal(rows["label"], [1, 1, 0])  # y = 1[G_t > 0]
  np.testing.assert_allclose(rows["mc_return"], [0.5, 1.0, 0.0])
  np.testing.assert_array_equal(rows["reward"], [0, 1, 0])
  # s' of a step is the next step's prompt; after the last step, the prompt with that action as history
  np.testing.assert_array_equal(rows["next_text"][0], rows["text"][1])
  after = critics.bag_of_words([autoui.autoui_prepare_prompt("lose", [trajs[1].steps[0].action])], 16)[0]
  np.testing.assert_array_equal(rows["next_text"][2], after)
  traj_rows = critics.trajectory_arrays(trajs, 16)
  np.testing.assert_array_equal(traj_rows["label"], [1, 0])
  np.testing.assert_array_equal(traj_rows["text"][0], critics.bag_of_words(["Previous Actions: Goal: win</s>"], 16)[0])


def test_bag_of_words_is_fixed_and_tells_goals_apart():
  a, b, a2 = critics.bag_of_words(["Goal: sort shoes", "Goal: sort hats", "Goal: sort shoes"], 64)
  np.testing.assert_array_equal(a, a2)
  assert not np.array_equal(a, b)
  assert a.sum() == pytest.approx(5 / np.sqrt(5))  # 3 words + 2 bigrams, scaled by 1/√5


def test_code_advantage_and_hard_filter():
  arrays = {"reward": np.array([0, 1, 0, 0], np.float32), "mc_return": np.array([0.5, 1, 0, 0], np.float32)}
  v = np.array([0.2, 0.5, 0.5, 0.3], np.float32)
  v_next = np.array([0.5, 0.4, 0.52, 0.4], np.float32)
  adv, w = critics.step_weights(v, v_next, arrays, "code")
  # A = V(s') − V(s) − 0.05 + r + G
  np.testing.assert_allclose(adv, [0.75, 1.85, -0.03, 0.05], atol=1e-6)
  np.testing.assert_array_equal(w, [1, 1, 0, 1])  # 1[clamp(A, 0, 1) > 0]


def test_doubly_robust_advantage_and_one_over_h_threshold():
  # one successful 3-step trajectory (H = last step 2), λ = γ = 0.5
  arrays = {"reward": np.array([0, 0, 1], np.float32), "mc_return": np.array([0.25, 0.5, 1], np.float32),
            "final_reward": np.ones(3, np.float32), "last_step": np.full(3, 2.0, np.float32),
            "index": np.array([[0, 0], [0, 1], [0, 2]], np.int32)}
  v = np.array([0.2, 0.4, 0.6], np.float32)
  v_next = np.array([0.4, 0.6, 0.9], np.float32)
  adv, w = critics.step_weights(v, v_next, arrays, "dr", gamma=0.5, horizon=10)
  # λ^{H−h}: 0.25, 0.5, 1 → A = d·1 + (1 − d)(V' + r − V)
  expected = [0.25 + 0.75 * 0.2, 0.5 + 0.5 * 0.2, 1.0]
  np.testing.assert_allclose(adv, expected, atol=1e-6)
  np.testing.assert_array_equal(w, [1, 1, 1])
  adv, w = critics.step_weights(np.array([0.5]), np.array([0.55]), {
      "reward": np.zeros(1), "mc_return": np.zeros(1), "final_reward": np.zeros(1), "last_step": np.array([4.0]),
      "index": np.array([[0, 1]])}, "dr", gamma=0.5, horizon=10)
  np.testing.assert_allclose(adv, [(1 - 0.125) * 0.05], atol=1e-6)
  np.testing.assert_array_equal(w, [0])  # 0.04375 < 1/H = 0.1
  with pytest.raises(ValueError, match="actor.advantage"):
    critics.step_weights(v, v_next, arrays, "gae")


def test_filterbc_keeps_the_successes_or_everything_below_ten_percent():
  five_of_twenty = [_traj(f"t{i}", 1, float(i < 5)) for i in range(20)]
  np.testing.assert_array_equal(critics.filterbc_keep(five_of_twenty), [True] * 5 + [False] * 15)
  one_of_twenty = [_traj(f"t{i}", 1, float(i == 0)) for i in range(20)]
  assert critics.filterbc_keep(one_of_twenty).all()  # the 0.9-quantile is 0: the code's quirk keeps failures too


def test_digirl_filter_prefers_successes_on_hard_instructions():
  trajs = [_traj(f"t{i}", 1, float(i < 4)) for i in range(20)]
  v_inst = np.full(20, 0.5, np.float32)
  v_inst[:4] = [0.9, 0.1, 0.3, 1.0]  # b = 1 − V: 0.1, 0.9, 0.7, ~1e-4
  keep = critics.digirl_keep(trajs, v_inst)
  # sorted b: −0.5 × 16, 1e-4, 0.1, 0.7, 0.9; the 0.9-quantile sits at position 17.1: 0.1 + 0.1 · 0.6 = 0.16
  b = np.array([1 - 0.9, 1 - 0.1, 1 - 0.3, 1 - (1 - 1e-4)] + [-0.5] * 16)
  np.testing.assert_array_equal(keep, b >= np.quantile(b, 0.9))
  assert keep[1] and keep[2] and not keep[0] and not keep[3] and not keep[4:].any()  # the two hardest successes


@pytest.mark.slow
def test_critic_losses_are_the_codes_cross_entropies():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  model = critics.StepCritic(text_dim=3, image_dim=2, hidden=4, seed=0)
  batch = {"text": jnp.ones((2, 3)), "image": jnp.zeros((2, 2)), "next_text": jnp.zeros((2, 3)),
           "next_image": jnp.ones((2, 2)), "label": jnp.array([1.0, 0.0])}
  loss, _ = critics.step_critic_loss(model, batch)

  def ce(logits, y):
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.mean(np.where(y > 0, logp[:, 1], logp[:, 0]))

  h1, h2 = (np.asarray(x) for x in model(batch["text"], batch["image"]))
  n1, n2 = (np.asarray(x) for x in model(batch["next_text"], batch["next_image"]))
  y = np.array([1.0, 0.0])
  assert float(loss) == pytest.approx(ce(h1, y) + ce(h2, y) + ce(n1, y) + ce(n2, y), rel=1e-5)
  traj = critics.TrajectoryCritic(text_dim=3, hidden=4, seed=0)
  tloss, _ = critics.trajectory_critic_loss(traj, {"text": batch["text"], "label": batch["label"]})
  assert float(tloss) == pytest.approx(ce(np.asarray(traj(batch["text"])), y), rel=1e-5)
