"""WebRL's outcome reward model input and scoring (`proj/webrl/orm.py`, `agents/webrl.py`'s ORM helpers)."""

import jax
import numpy as np
import pytest

from jaxagent import types
from jaxagent.agents import webrl as fmt
from jaxagent.data import conversation
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.proj.webrl import orm

INTENT = "Add the blue mug to my cart"
HTMLS = ['<html><a id="1">Home</a></html>', '<html><button id="2">Search</button></html>',
         '<html><button id="7">Add to cart</button></html>']
REPLIES = ['# Go home first\ndo(action="Click", element="1")', 'do(action="Type", argument="mug", element="2")',
           '# Now add it\n# to the cart\nexit(message="done")']


def _traj(htmls=HTMLS, replies=REPLIES, intent=INTENT, success=None):
  task = types.Task(id="t0", intent=intent, site="shop", start_url="http://127.0.0.1/")
  steps = [types.Step(step=k, obs_text=fmt.webrl_prompt(intent, replies[:k], html), action_text=replies[k])
           for k, html in enumerate(htmls)]
  return types.Trajectory(task, steps, success=success)


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer(None, require_image_token=False)


@pytest.fixture(scope="module")
def loaded():
  from jaxagent.serving.checkpoint import random_policy
  return random_policy("decoder", seed=3, num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128)


# ----------------------------------------------------------------------------------------------- the text


def test_orm_text_is_the_system_prompt_then_rm_format_over_the_last_steps_html():
  expected = (fmt.ORM_SYSTEM_PROMPT + "\n\n"
              "The User Intent:\nAdd the blue mug to my cart\n\n"
              "Action History:\n"
              '# Go home first; do(action="Click", element="1")\n'
              'do(action="Type", argument="mug", element="2")\n'
              '# Now add it; # to the cart; exit(message="done")\n'
              "\n"
              "The Current Screenshot:\n"
              '<html><button id="7">Add to cart</button></html>')
  text = orm.orm_text(_traj())
  assert text == expected
  assert text.startswith(fmt.ORM_SYSTEM_PROMPT)
  for earlier in HTMLS[:-1]:  # only the page seen before the last action
    assert earlier not in text


def test_cut_screen_cuts_only_the_final_page():
  text = orm.orm_text(_traj())
  assert orm.cut_screen(text, 6) == text.replace('<html><button id="7">Add to cart</button></html>', "<html>")
  assert orm.cut_screen(text, 1000) == text
  assert orm.cut_screen("no screen", 3) == "no screen"


def test_orm_text_strips_the_intent_and_of_a_one_step_episode_reads_its_only_page():
  text = orm.orm_text(_traj(htmls=HTMLS[:1], replies=REPLIES[:1], intent="  spaced intent \n"))
  assert "The User Intent:\nspaced intent\n\nAction History:\n" in text
  assert text.endswith("The Current Screenshot:\n" + HTMLS[0])


def test_orm_text_of_an_episode_without_steps_has_an_empty_screen():
  text = orm.orm_text(types.Trajectory(types.Task(id="e", intent="x", site="shop", start_url="u")))
  assert text == fmt.ORM_SYSTEM_PROMPT + "\n\nThe User Intent:\nx\n\nAction History:\n\nThe Current Screenshot:\n"


def test_orm_sample_replies_yes_or_no_after_the_orm_text():
  traj = _traj()
  yes, no = orm.orm_sample(traj, True), orm.orm_sample(traj, False, "custom")
  assert yes["id"] == "t0" and no["id"] == "custom"
  assert yes["conversations"] == [{"from": "human", "value": orm.orm_text(traj)}, {"from": "gpt", "value": "YES"}]
  assert no["conversations"][1] == {"from": "gpt", "value": "NO"}
  assert yes["images"] == []


def test_current_html_returns_the_html_the_prompt_was_built_over():
  html = '<div id="4">Round 1\n\nnot a header</div>'
  assert fmt.current_html(fmt.webrl_prompt(INTENT, [], html)) == html  # round 0
  assert fmt.current_html(fmt.webrl_prompt(INTENT, REPLIES[:2], html)) == html  # round 2, history before it
  assert fmt.current_html("no webrl prompt here") == ""


def test_compact_html_keeps_the_original_parsers_attributes_without_bboxes():
  html = ('<a id="3" href="/s/0123456789abcdef/shop/cart" data-bbox="10,20,30,40">Cart</a>'
          '<input id="4" type="search" placeholder="Search" aria-label="Search" name="q" value="x" data-bbox="0,0,1,1">'
          '<option selected="true" title="t" data-text="d">o</option>')
  assert fmt.compact_html(html) == ('<a id="3">Cart</a><input id="4" type="search" placeholder="Search" value="x">'
                                    '<option selected="true" title="t" data-text="d">o</option>')


# ----------------------------------------------------------------------------------------- answer tokens


def _reply_tokens(answer, tokenizer):
  ids, loss = conversation.tokenize({"id": "p", "images": [], "conversations": [
      {"from": "human", "value": "?"}, {"from": "gpt", "value": answer}]}, tokenizer, 1)
  return ids[loss > 0]


def test_answer_ids_are_where_yes_and_no_part(tokenizer):
  yes, no, offset = orm.answer_ids(tokenizer)
  assert yes != no
  assert tokenizer.decode([yes]) and "YES".startswith(tokenizer.decode([yes]))
  assert tokenizer.decode([no]) and "NO".startswith(tokenizer.decode([no]))
  a, b = _reply_tokens("YES", tokenizer), _reply_tokens("NO", tokenizer)
  shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
  assert offset == shared
  assert (a[offset], b[offset]) == (yes, no)
  np.testing.assert_array_equal(a[:offset], b[:offset])


# ------------------------------------------------------------------------------------------ probabilities


def _hand_p_yes(loaded, traj):
  a, b = _reply_tokens("YES", loaded.tokenizer), _reply_tokens("NO", loaded.tokenizer)
  offset = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)  # the reply tokens YES and NO share
  yes, no = a[offset], b[offset]
  ids, loss = conversation.tokenize(orm.orm_sample(traj, True), loaded.tokenizer, 1)
  at = int(np.flatnonzero(loss)[0]) - 1 + offset
  logits = np.asarray(loaded.model(jax.numpy.asarray(ids[None, :-1])))[0, at].astype(np.float64)
  two = np.array([logits[yes], logits[no]])
  e = np.exp(two - two.max())
  return e[0] / e.sum()


@pytest.mark.slow
def test_probabilities_are_the_softmax_of_yes_and_no_where_the_replies_part(loaded):
  trajs = [_traj(), _traj(htmls=HTMLS[:1], replies=REPLIES[:1], intent="Open the wiki")]
  p = orm.probabilities(loaded, trajs, batch=2)
  assert p.shape == (2,) and p.dtype == np.float32
  np.testing.assert_allclose(p, [_hand_p_yes(loaded, t) for t in trajs], atol=1e-5)
  assert np.all((p > 0) & (p < 1))
  assert orm.probabilities(loaded, []).shape == (0,)


# -------------------------------------------------------------------------------------------- agreement


def test_agreement_counts_the_orm_label_against_the_verdict():
  probs = np.array([0.9, 0.2, 0.5, 0.49, 0.7, 0.1])
  verdicts = [1.0, 0.0, 0.0, 1.0, None, 0.0]
  # (label, verdict): (1,1) TP, (0,0) TN, (1,0) FP (0.5 labels YES), (0,1) FN, skipped, (0,0) TN
  assert orm.agreement(probs, verdicts) == {"episodes": 5, "agreement": 3 / 5, "true_positive": 1,
                                            "true_negative": 2, "false_positive": 1, "false_negative": 1}


def test_agreement_without_verdicts_is_none():
  assert orm.agreement(np.zeros(0), []) == {"episodes": 0, "agreement": None}
  assert orm.agreement(np.array([0.3, 0.8]), [None, None]) == {"episodes": 0, "agreement": None}


def test_near_misses_carry_a_siblings_solution_under_their_own_intent_and_evaluator():
  def task(i, template, intent):
    return types.Task(id=f"t{i}", intent=intent, site="shop", start_url="http://x/", template=template,
                      evaluator={"kind": "url_match", "url": intent}, oracle=[{"op": "answer", "text": intent}])
  pool = [task(0, "a", "A0"), task(1, "a", "A1"), task(2, "a", "A2"), task(3, "b", "B0")]
  misses = orm.near_misses(pool, pool, seed=0)
  assert [m.id for m in misses] == ["t0", "t1", "t2"]  # t3 has no sibling: left out
  for m, original in zip(misses, pool):
    assert m.intent == original.intent and m.evaluator == original.evaluator
    solved = m.oracle[0]["text"]
    assert solved != m.intent and solved.startswith("A")  # another task of the same template
  assert orm.near_misses(pool, pool, seed=0) == misses


# ----------------------------------------------------------------------------------------- the held-out split


def _episodes(intents, success=1.0):
  return [_traj(intent=i, success=success) for i in intents]


def test_split_by_task_holds_out_whole_intents_and_their_demonstrations():
  judged = _episodes(["A", "A", "B", "C", "C", "D"]) + _episodes(["B", "D"], success=0.0)
  demos = _episodes(["A", "B", "C", "D"])
  train, val = orm.split_held_out(judged, demos, 0.5, seed=0, by="task")
  held = {t.task.intent for t in val}
  assert len(held) == 2  # round(4 intents × 0.5)
  assert sorted(t.task.intent for t in val) == sorted(t.task.intent for t in judged if t.task.intent in held)
  assert not held & {t.task.intent for t in train}  # no held-out intent is in train, demonstrations included
  assert len(train) + len(val) == len(judged) + len(demos) - 2  # the two held-out intents' demonstrations dropped
  assert orm.split_held_out(judged, demos, 0.5, seed=0, by="task") == (train, val)
  assert {t.task.intent for t in orm.split_held_out(judged, demos, 0.5, seed=1, by="task")[1]} != held or \
      {t.task.intent for t in orm.split_held_out(judged, demos, 0.5, seed=2, by="task")[1]} != held


def test_split_by_episode_draws_each_episode_and_keeps_every_demonstration():
  judged = _episodes(list("ABCDEFGHIJ"))
  demos = _episodes(list("ABC"))
  train, val = orm.split_held_out(judged, demos, 0.3, seed=5, by="episode")
  held = np.random.default_rng(5).random(10) < 0.3  # the draw the recipe has always made
  assert [t.task.intent for t in val] == [i for i, h in zip("ABCDEFGHIJ", held) if h]
  assert train[-3:] == demos and len(train) == 10 - int(held.sum()) + 3


def test_split_refuses_an_unknown_mode_naming_the_key():
  with pytest.raises(ValueError, match="orm.held_out"):
    orm.split_held_out([], [], 0.25, seed=0, by="intent")


# ------------------------------------------------------------------------------ the final page (`rm_format`)


def _rm_format(content):
  """THUDM/WebRL scripts/process_data.py:build_rm_data.rm_format, transcribed."""
  task = content[0]["target"]
  last_html = content[-1]["html"]
  instruction = "The User Intent:\n" + task.strip() + "\n\n" + "Action History:\n"
  for item in content:
    response = item["fixed_response"]
    instruction += "; ".join(response.split("\n")).strip() + "\n"
  return instruction + "\n" + "The Current Screenshot:\n" + last_html.strip()


LONG = ['<html><a id="1">Home</a></html>', '<html>' + "".join(f'<a id="{k}">item {k}</a>' for k in range(60)) +
        '<button id="7" data-bbox="1,2,3,4">Add to cart</button></html>']


def _observed(htmls=LONG, replies=REPLIES[1:], compact=False, max_chars=400):
  """An episode as the collector stores it: each step's prompt cut at `max_chars`, its observation kept."""
  agent = fmt.WebRL(compact=compact, max_prompt_chars=max_chars)
  task = types.Task(id="t0", intent=INTENT, site="shop", start_url="http://127.0.0.1/")
  steps = []
  for k, (html, reply) in enumerate(zip(htmls, replies)):
    obs = types.Observation(html=html)
    steps.append(types.Step(step=k, obs_text=agent.build_prompt(task, obs, steps), action_text=reply, observation=obs))
  return types.Trajectory(task, steps)


def test_the_orm_reads_the_whole_last_page_as_rm_format_not_the_prompts_cut():
  traj = _observed()
  trace = [{"target": INTENT, "html": s.observation.html, "fixed_response": s.action_text} for s in traj.steps]
  assert orm.orm_text(traj) == fmt.ORM_SYSTEM_PROMPT + "\n\n" + _rm_format(trace)
  assert orm.orm_text(traj).endswith("Add to cart</button></html>")
  cut = fmt.current_html(traj.steps[-1].obs_text)
  assert len(cut) < len(LONG[1]) and orm.orm_text(traj, page="prompt").endswith("The Current Screenshot:\n" + cut)
  compact = _observed(compact=True)  # the page as the prompts read it: through compact_html
  assert orm.orm_text(compact, compact=True).endswith(fmt.compact_html(LONG[1]))
  assert "data-bbox" not in orm.orm_text(compact, compact=True)
  with pytest.raises(ValueError, match="config.orm.page='cut'"):
    orm.orm_text(traj, page="cut")


def test_the_runs_text_options_are_its_orm_page_and_html():
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config()
  assert orm.text_options(config) == {"page": "full", "compact": True}
  config.html, config.orm.page = "full", "prompt"
  assert orm.text_options(config) == {"page": "prompt", "compact": False}


def _length(item, tokenizer):
  return len(conversation.tokenize(item, tokenizer, 1)[0]) - 1


def test_fit_keeps_the_first_tokens_cutting_the_pages_end(tokenizer):
  item = orm.orm_sample(_observed(), True)
  text = item["conversations"][0]["value"]
  n = _length(item, tokenizer)
  assert orm.fit(item, tokenizer, n) is item  # fits: untouched
  fitted = orm.fit(item, tokenizer, n - 40)
  new = fitted["conversations"][0]["value"]
  assert _length(fitted, tokenizer) <= n - 40
  assert text.startswith(new) and "The Current Screenshot:\n<html>" in new  # the head kept, the page's end gone
  page = len(new) - text.rindex("The Current Screenshot:\n") - len("The Current Screenshot:\n")
  one_more = {**item, "conversations": [{**item["conversations"][0], "value": text[:len(new) + 1]},
                                        item["conversations"][1]]}
  assert page > 0 and _length(one_more, tokenizer) > n - 40  # the longest page prefix that fits
  assert fitted["conversations"][1] == {"from": "gpt", "value": "YES"}  # the answer is still asked and given


def test_probabilities_score_the_fitted_full_page_texts(loaded, monkeypatch):
  seen = {}

  def score(model, items, **kwargs):
    seen.update(items=items, **kwargs)
    return {"logits": np.zeros((len(items), 2), np.float32)}

  monkeypatch.setattr(orm.scoring, "score", score)
  traj = _observed()
  n = _length(orm.orm_sample(traj, True), loaded.tokenizer)
  p = orm.probabilities(loaded, [traj, _traj()], max_len=n - 30)
  np.testing.assert_allclose(p, [0.5, 0.5])
  first, second = (it["conversations"][0]["value"] for it in seen["items"])
  assert seen["max_len"] == n - 30 and _length(seen["items"][0], loaded.tokenizer) <= n - 30
  assert orm.orm_text(traj).startswith(first) and len(first) > len(orm.orm_text(traj, page="prompt"))
  assert second == orm.orm_text(_traj())  # short: as it is


def test_the_orm_trains_on_samples_fit_to_its_length_with_pi0s_tokenizer(tokenizer, monkeypatch, tmp_path):
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config()
  tokenizer.save_pretrained(str(tmp_path / "sft" / "tokenizer"))
  item = orm.orm_sample(_observed(), False)
  config.data.seq_len = _length(item, tokenizer) - 25
  trained = {}
  monkeypatch.setattr(orm, "finetune", lambda cfg, out, items, **kw: trained.update(items=items))
  monkeypatch.setattr(orm, "score", lambda *args: np.zeros(0, np.float32))
  orm.train(config, str(tmp_path), str(tmp_path / "orm"), [item], [])
  (fitted,) = trained["items"]
  assert _length(fitted, tokenizer) <= config.data.seq_len
  assert item["conversations"][0]["value"].startswith(fitted["conversations"][0]["value"])
