"""The pre-training corpus teaches skills on pages of unevaluated worlds: every reply is right for its query and
page, copied strings are random, and no evaluation world enters."""

import collections
import random
import re

import pytest

from jaxagent import agents
from jaxagent.agents import autoui_text
from jaxagent.agents.webrl import WebRL, current_html
from jaxagent.proj.pretrain import corpus
from jaxagent.types import ActionKind

FMT = WebRL()


@pytest.fixture(scope="module", params=["pages", "windows"])
def samples(request):
  pages, windows = corpus.samples(1000, 2, walks_per_world=4, walk_steps=4, sample_chars=3000, seed=0,
                                  window_chars=700, windows_per_page=2, window_sample_chars=1500)
  return pages if request.param == "pages" else windows


def _element_text(html: str, eid: str) -> str:
  m = re.search(rf'<(?:a|button|input|textarea|select)\b id="{eid}"[^>]*>([^<]*)<', html)
  return m.group(1).strip() if m else ""


@pytest.mark.slow
def test_every_reply_answers_its_query_on_its_page(samples):
  checked = {"click": 0, "mention": 0, "type": 0, "search": 0, "read": 0, "say": 0}
  styles = collections.Counter()
  for item in samples:
    turns = item["conversations"]
    html = current_html(turns[0]["value"] + "\n\n<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n")
    if item["id"].startswith("page-"):
      assert "seed 100" in html  # a page of world 1000 or 1001 (the sites' footer names its world)
    for k, (human, gpt) in enumerate(zip(turns[0::2], turns[1::2])):
      query = re.search(r"Task Instruction: (.*?)(?:\n|$)", human["value"]).group(1)
      quoted = re.findall(r'"([^"]*)"|\u201c([^\u201d]*)\u201d', query)
      quoted = [a or b for a, b in quoted]
      styles.update(["curly" if "\u201c" in query else "straight" if '"' in query else "bare"])
      action = FMT.parse(gpt["value"])
      assert action.kind != ActionKind.INVALID, gpt["value"]
      if action.kind == ActionKind.CLICK and query.startswith(corpus._OPENERS):  # pylint: disable=protected-access
        # the one element the sentence mentions that no earlier round of the prompt clicked
        name = _element_text(html, str(action.element))
        clicked = re.findall(r'I will click "([^"]+)"', human["value"]) if k == 0 else []
        assert name.lower() in query.lower() and name not in clicked, (query, clicked, gpt["value"])
        checked["mention"] += 1
      elif action.kind == ActionKind.CLICK:
        name = _element_text(html, str(action.element))
        assert (name == quoted[0]) if quoted else (name in query), (query, gpt["value"])
        checked["click"] += 1
      elif action.kind == ActionKind.TYPE:
        assert action.text in quoted and (action.enter or f'id="{action.element}"' in html)
        checked["search" if action.enter else "type"] += 1
      elif query.startswith(("What is", "Tell me")):
        name = quoted[0] if quoted else re.search(r"(?:price|rating|reviews) of (.+?)[?.]$", query).group(1)
        assert re.search(re.escape(name) + r" </a> [^<]*" + re.escape(action.text), html), (query, action)
        checked["read"] += 1
      else:
        assert action.kind == ActionKind.ANSWER and action.text == quoted[0]
        checked["say"] += 1
  assert all(n > 0 for n in checked.values()), checked
  assert set(styles) == set(corpus.QUOTES), styles  # every quoting style, copies quoted in each
  assert sum(len(it["conversations"]) // 2 for it in samples) > 5 * len(samples)  # follow-ups on each page


def test_typed_strings_are_drawn_afresh_so_only_copying_predicts_them():
  a = [corpus.random_string(random.Random(f"a{k}")) for k in range(300)]
  b = {corpus.random_string(random.Random(f"b{k}")) for k in range(300)}
  assert len(set(a)) > 280 and len(set(a) & b) < 15


def test_probe_examples_are_single_queries_in_the_recipes_prompt():
  examples = corpus.examples(5000, 1, walks_per_world=2, walk_steps=3, per_page=2, seed=1)
  assert examples and all(ex.prompt.startswith("Task Instruction: ") for ex in examples)
  for ex in examples:
    action = FMT.parse(ex.reply)
    if ex.element:
      assert str(action.element) == ex.element
    if ex.text:
      assert action.text == ex.text
    # the expert's note: the string typed, or the element clicked as the page names it
    note = re.match(r'# Note: (I will (click|type) "(.*)"|The task is complete)', ex.reply)
    assert note, ex.reply
    if note.group(2) == "type":
      assert note.group(3) == ex.text
    elif note.group(2) == "click":
      assert re.search(f'<a id="{ex.element}"[^>]*> {re.escape(note.group(3))} <', ex.prompt) or \
          re.search(f'id="{ex.element}"[^>]*>\\s*{re.escape(note.group(3))}\\s*<', ex.prompt), ex.reply


def test_worlds_below_the_pretraining_range_are_refused():
  corpus.check_worlds("corpus.worlds", 1000, 5)
  for first, count in ((0, 10), (999, 3), (1000, 0)):
    with pytest.raises(ValueError, match="corpus.worlds"):
      corpus.check_worlds("corpus.worlds", first, count)


@pytest.mark.slow
def test_no_benchmark_intent_or_demonstration_reply_is_in_the_corpus(samples):
  from jaxagent.envs.sites import bench  # pylint: disable=g-import-not-at-top
  intents = {t.intent for split in ("train_a", "test_comb", "test_value", "test_template")
             for t in bench.generate(0, "text", 2, splits=(split,))[split]}
  queries = {re.search(r"Task Instruction: (.*?)(?:\n|$)", t["value"]).group(1)
             for it in samples for t in it["conversations"][0::2]}
  assert queries and not queries & intents
  # the replies open with the note a demonstration writes, but never quote a string a benchmark task types or answers
  strings = {s for split in ("train_a", "test_comb", "test_value", "test_template")
             for t in bench.generate(0, "text", 2, splits=(split,))[split] for s in t.meta.get("texts") or []}
  notes = [re.match(r'# Note: (.*)\n', t["value"]) for it in samples for t in it["conversations"][1::2]]
  assert strings and all(notes)
  assert not {q for note in notes for q in re.findall(r'"([^"]*)"', note.group(1))} & strings


@pytest.mark.slow
def test_a_mention_has_one_answer_the_element_it_names_that_no_earlier_round_clicked():
  examples = corpus.examples(1000, 1, walks_per_world=3, walk_steps=4, per_page=3, skills=("mention",), seed=2)
  assert len(examples) > 20
  with_history = 0
  for ex in examples:
    html = current_html(ex.prompt)
    query = re.search(r"Task Instruction: (.*?)\n", ex.prompt).group(1)
    clicked = set(re.findall(r'I will click "([^"]+)"', ex.prompt))
    target = _element_text(html, ex.element)
    assert target.lower() in query.lower() and target not in clicked
    for text in corpus._unique_elements(html):  # pylint: disable=protected-access
      if text != target and re.search(r"(?<!\w)" + re.escape(text.lower()) + r"(?!\w)", query.lower()):
        assert text in clicked, (query, text, clicked)  # any other element it names was clicked before
        with_history += 1
  assert with_history > 5


PHONE = agents.get_format("autoui_text")


@pytest.fixture(scope="module")
def phone_samples():
  pages, windows = corpus.samples(1000, 2, walks_per_world=4, walk_steps=4, sample_chars=3000, seed=0,
                                  window_chars=700, windows_per_page=1, window_sample_chars=1500,
                                  formats=("webrl", "autoui_text"))
  return [it for it in pages + windows if it["id"].startswith("phone-")], pages


def _goal(turn: str) -> tuple[str, list[str], str]:
  """(the goal, the strings it quotes, the last decision before it) of a phone prompt or follow-up turn."""
  m = re.search(r"Previous Actions: (.*?)Goal: (.*)</s>$", turn, re.S)
  return m.group(2), [a or b for a, b in re.findall(r'"([^"]*)"|\u201c([^\u201d]*)\u201d', m.group(2))], m.group(1)


@pytest.mark.slow
def test_the_phones_replies_are_the_phone_experts_steps_for_each_goal(phone_samples):
  phone, pages = phone_samples
  assert phone and any(not it["id"].startswith("phone-") for it in pages)  # both formats, the walks shared
  checked = collections.Counter()
  for item in phone:
    turns = item["conversations"]
    screen = re.match(r"Screen: (.*)\nPrevious Actions: ", turns[0]["value"], re.S).group(1)
    assert len(screen) <= autoui_text.MAX_PAGE_CHARS
    if item["id"].startswith("phone-page-"):
      assert "seed 100" in screen and ("launcher" in screen or "<a id=" in screen)  # the phone's pages
    for human, gpt in zip(turns[0::2], turns[1::2]):
      goal, quoted, previous = _goal(human["value"])
      action = PHONE.parse(gpt["value"])
      assert gpt["value"] == PHONE.render(action)  # the expert's rendering: the plan is the action's type
      if action.kind == ActionKind.CLICK:  # a tap on an element the goal names (or a field it types into)
        name = _element_text(screen, str(action.element))
        field = re.search(rf'id="{action.element}"[^>]*placeholder="([^"]+)"', screen)
        assert (name and name.lower() in goal.lower()) or (field and field.group(1) in goal) or \
            re.search(rf'<label> [^<]+ </label> <(?:textarea|input)\b id="{action.element}"', screen) or \
            re.search(rf'<input id="{action.element}" type="search"', screen), (goal, gpt["value"])
        assert f'"touch_point": "id={action.element}"' not in previous  # not the tap already made
        checked["tap"] += 1
      elif action.kind == ActionKind.TYPE:  # the goal's string, once the last decision tapped its field
        assert action.text in quoted and '"touch_point": "id=' in previous, (goal, previous)
        checked["type"] += 1
      else:  # a search's enter, once the last decision typed the goal's string
        assert action.kind == ActionKind.KEY and f'"typed_text": "{quoted[0]}"' in previous, (goal, previous)
        checked["enter"] += 1
  assert all(checked[k] > 0 for k in ("tap", "type", "enter")), checked


def test_phone_probes_are_single_goals_in_the_phones_prompt():
  examples = corpus.examples(5000, 1, walks_per_world=3, walk_steps=4, per_page=3, seed=1, formats=("autoui_text",))
  assert examples and {ex.format for ex in examples} == {"autoui_text"}
  assert {ex.skill for ex in examples} <= set(corpus.FORMAT_SKILLS["autoui_text"])  # no read or say: no answer text
  for ex in examples:
    assert ex.prompt.startswith("Screen: ") and ex.prompt.endswith("</s>")
    action = PHONE.parse(ex.reply)
    if ex.element:  # a tap's step
      assert action.kind == ActionKind.CLICK and str(action.element) == ex.element
    if ex.text:  # a TYPE's step
      assert action.kind == ActionKind.TYPE and action.text == ex.text


@pytest.mark.slow
def test_no_benchmark_intent_is_a_phone_goal(phone_samples):
  from jaxagent.envs.sites import bench  # pylint: disable=g-import-not-at-top
  intents = {t.intent for split in ("train_a", "test_comb", "test_value", "test_template")
             for t in bench.generate(0, "device", 2, splits=(split,))[split]}
  goals = {_goal(t["value"])[0] for it in phone_samples[0] for t in it["conversations"][0::2]}
  assert goals and not goals & intents
