"""WebVoyager GPT-4o formats: prompts byte for byte, `extract_information`, user turns, history clipping."""

import hashlib

import numpy as np
import pytest

from jaxagent.agents import base
from jaxagent.agents import get_format
from jaxagent.agents import webvoyager as wv
from jaxagent.agents import webvoyager_prompts as P
from jaxagent.types import Action, ActionKind, Observation, Step, Task

TASK = Task(id="Amazon--4", intent="Check out deals in the Amazon Basics section.", site="shop",
            start_url="https://www.amazon.com/")


def _sha(s):
  return hashlib.sha256(s.encode()).hexdigest()[:16]


def test_system_prompts_are_the_originals():
  # Lengths of the originals' prompts.py files re-assembled from our constants equal the files' lengths
  # (MinorJerry/WebVoyager:prompts.py = 6933 chars, OpenWebVoyager:WebVoyager/prompts.py = 10400 chars).
  wv_file = (f'SYSTEM_PROMPT = """{P.SYSTEM_PROMPT}"""\n\n\nSYSTEM_PROMPT_TEXT_ONLY = """'
             f'{P.SYSTEM_PROMPT_TEXT_ONLY}"""\n')
  owv_file = (f'SYSTEM_PROMPT = """{P.OWV_SYSTEM_PROMPT}"""\n\n\nSYSTEM_PROMPT_TEXT_ONLY = """'
              f'{P.OWV_SYSTEM_PROMPT_TEXT_ONLY}"""\n\n\nSYSTEM_PROMPT_ACTREE_IMAGE = """{P.SYSTEM_PROMPT_ACTREE_IMAGE}"""')
  assert len(wv_file) == 6933
  assert len(owv_file) == 10400
  pinned = {
      "SYSTEM_PROMPT": (3628, "d5d4c8fd82fa6fe0"),
      "SYSTEM_PROMPT_TEXT_ONLY": (3247, "5d077a91974ecce9"),
      "OWV_SYSTEM_PROMPT": (3641, "88fbbafc72dd4d2b"),
      "OWV_SYSTEM_PROMPT_TEXT_ONLY": (3246, "382c849fa2f3299d"),
      "SYSTEM_PROMPT_ACTREE_IMAGE": (3418, "7dc69fc1f2cb8a69"),
      "AUTO_EVAL_SYSTEM_PROMPT": (2157, "b666ebf53ca6d2d8"),
  }
  for name, (length, sha) in pinned.items():
    s = getattr(P, name)
    assert (len(s), _sha(s)) == (length, sha), name
  assert P.SYSTEM_PROMPT.startswith("Imagine you are a robot browsing the web, just like humans.")
  assert "- Google\n- ANSWER; [content]" in P.SYSTEM_PROMPT
  assert "- Restart\n- ANSWER; [content]" in P.SYSTEM_PROMPT_ACTREE_IMAGE
  assert "Vsit video websites" in P.SYSTEM_PROMPT  # the original's typo is part of the prompt
  assert P.SYSTEM_PROMPT.endswith("Observation: {A labeled screenshot Given by User}")


@pytest.mark.parametrize("text,expected", [
    ("Click [19]", ("click", ("19",))),
    ("Click 7", ("click", ("7",))),
    ("Type [6]; KNTPLC", ("type", {"number": "6", "content": "KNTPLC"})),
    ("Type [6]; [New York]", ("type", {"number": "6", "content": "New York"})),
    ("Scroll [WINDOW]; [down]", ("scroll", {"number": "WINDOW", "content": "down"})),
    ("Scroll [12]; up", ("scroll", {"number": "12", "content": "up"})),
    ("Wait", ("wait", ())),
    ("GoBack", ("goback", ())),
    ("Google", ("google", ())),
    ("ANSWER; 42 dollars", ("answer", {"content": "42 dollars"})),
    ("ANSWER: 42", (None, None)),  # WebVoyager's `[; ]`
    ("  Wait", (None, None)),  # `^Wait` is anchored
    ("ANSWER; Click 3 times", ("click", ("3",))),  # regexes are searched in order, unanchored
])
def test_extract_information_webvoyager(text, expected):
  assert wv.extract_information(text, wv.PATTERNS_WEBVOYAGER) == expected


def test_extract_information_openwebvoyager():
  assert wv.extract_information("ANSWER: 42", wv.PATTERNS_OPENWEBVOYAGER) == ("answer", {"content": "42"})
  assert wv.extract_information("Restart", wv.PATTERNS_OPENWEBVOYAGER) == ("restart", ())
  assert wv.extract_information("Google", wv.PATTERNS_OPENWEBVOYAGER) == (None, None)


def test_parse_replies():
  f = get_format("webvoyager")
  reply = ("Thought: In order to proceed with browsing Amazon, I need to complete the CAPTCHA challenge.\n\n"
           "Action: Type [6]; KNTPLC")
  assert f.parse(reply) == Action(ActionKind.TYPE, element=6, text="KNTPLC", enter=True)
  assert f.parse("Thought: go\nAction: Scroll [WINDOW]; down") == Action(ActionKind.SCROLL, direction="down")
  assert f.parse("Thought: x\nAction: Google") == Action(ActionKind.RESTART)
  assert f.parse("Action: Click [3]") == Action.invalid(P.FORMAT_ERROR)
  assert f.parse("Thought: x\nAction: Tap [3]") == Action.invalid(P.FAIL_OBS_WEBVOYAGER)
  owv = get_format("webvoyager_actree_image")
  assert owv.parse("Thought: x\nAction: Google") == Action.invalid(P.FAIL_OBS_OPENWEBVOYAGER)
  assert owv.parse("Thought: done\nAction: ANSWER: 3") == Action(ActionKind.ANSWER, text="3")
  # The action is the 3rd segment of the split, whatever comes first.
  assert f.parse("Action: GoBack Thought: Wait") == Action(ActionKind.WAIT)


def _history(fmt, task, n, errors=None, image=True):
  errors = errors or {}
  hist = []
  for i in range(n):
    obs = Observation(element_text=f"[0]: <input> \"q{i}\";", a11y_tree=f"[1] textbox 'q{i}'", error=errors.get(i, ""))
    text = fmt.observation_text(task, obs, hist)
    hist.append(Step(step=i, obs_text=text, action_text=fmt.render(Action(ActionKind.CLICK, element=i), f"t{i}"),
                     image_path=f"s{i}.png" if image else None))
  return hist


def test_user_turns_som():
  f = get_format("webvoyager")
  first = f.observation_text(TASK, Observation(element_text='[0]: <input> "Search";'), [])
  assert first == ("Now given a task: Check out deals in the Amazon Basics section.  Please interact with "
                   "https://www.amazon.com/ and get the answer. \nObservation: please analyze the attached screenshot "
                   "and give the Thought and Action. I've provided the tag name of each element and the text it "
                   "contains (if text exists). Note that <textarea> or <input> may be textbox, but not exactly. Please "
                   "focus more on the screenshot and then refer to the textual information.\n[0]: <input> \"Search\";")
  hist = _history(f, TASK, 1)
  warn = P.TYPE_WARN_OBS.format(tag="div", type="None")
  later = f.observation_text(TASK, Observation(element_text="E", error=warn), hist)
  assert later.startswith("Observation:note: The web element you're trying to type may not be a textbox, and its tag "
                          "name is <div>, type is None. please analyze the attached screenshot")
  assert later.endswith("textual information.\nE")
  fail = f.observation_text(TASK, Observation(element_text="E", error=P.FAIL_OBS_WEBVOYAGER), hist)
  assert fail == P.FAIL_OBS_WEBVOYAGER
  pdf = f.observation_text(TASK, Observation(element_text="E", error=P.PDF_OBS_PREFIX + "It is 7."), hist)
  assert pdf.startswith("Observation: You downloaded a PDF file, I ask the Assistant API to answer the task based on "
                        "the PDF file and get the following response: It is 7. Please analyze the response given by "
                        "Assistant, then consider whether to continue iterating or not. The screenshot of the current "
                        "page is also attached")


def test_history_clipping_keeps_last_three_images():
  f = get_format("webvoyager")
  hist = _history(f, TASK, 5, errors={2: P.FAIL_OBS_WEBVOYAGER})
  screenshot = np.zeros((8, 8, 3), np.uint8)
  msgs = f.build_prompt(TASK, Observation(element_text="E", screenshot=screenshot), hist)
  assert [m["role"] for m in msgs] == ["system"] + ["user", "assistant"] * 5 + ["user"]
  assert msgs[0]["content"] == P.SYSTEM_PROMPT
  assert base.count_images(msgs) == 3
  users = [m for m in msgs if m["role"] == "user"]
  # The failure turn (step 2) is text only and does not count toward the 3 images.
  assert users[2]["content"] == P.FAIL_OBS_WEBVOYAGER
  assert users[0]["content"] == ("Now given a task: Check out deals in the Amazon Basics section.  Please interact with "
                                 "https://www.amazon.com/ and get the answer.Observation: A screenshot and some texts. "
                                 "(Omitted in context.)")
  assert users[1]["content"] == P.CLIPPED_OBS
  assert [p["image"] for u in users[3:5] for p in u["content"] if p["type"] == "image"] == ["s3.png", "s4.png"]
  assert users[5]["content"][1]["image"] is screenshot
  assert msgs[-2]["content"] == "Thought: t4\n\nAction: Click [4]"


def test_clip_pdf_variant():
  msgs = [{"role": "user", "content": [base.text_part("Observation: " + P.PDF_OBS_PREFIX + "x"), base.image_part("a")]}]
  assert wv.clip_message_and_obs(msgs, 0)[0]["content"] == P.CLIPPED_OBS_PDF


def test_text_only_clipping_counts_every_user_turn():
  f = get_format("webvoyager_text")
  hist = _history(f, TASK, 4, image=False)
  msgs = f.build_prompt(TASK, Observation(a11y_tree="[1] RootWebArea 'x'"), hist)
  users = [m["content"] for m in msgs if m["role"] == "user"]
  assert all(isinstance(u, str) for u in users)
  assert users[0].endswith("get the answer.Observation: An accessibility tree. (Omitted in context.)")
  assert users[1] == P.CLIPPED_TREE
  assert users[2].startswith("Observation: please analyze the accessibility tree and give the Thought and Action.\n")
  assert users[4].endswith("[1] RootWebArea 'x'")
  assert msgs[0]["content"] == P.SYSTEM_PROMPT_TEXT_ONLY


def test_actree_image_teacher_keeps_observation_on_failure():
  f = get_format("webvoyager_actree_image")
  first = f.observation_text(TASK, Observation(a11y_tree="[1] link 'A'"), [])
  assert first.endswith("Observation: please analyze the attached accessibility tree & screenshot and give the Thought "
                        "and Action. I've provided the Accessibility Tree and Screenshot.\n[1] link 'A'\nScreenshot:\n")
  hist = _history(f, TASK, 1)
  later = f.observation_text(TASK, Observation(a11y_tree="T", error=P.FAIL_OBS_OPENWEBVOYAGER), hist)
  assert later == ("Observation:" + P.FAIL_OBS_OPENWEBVOYAGER + " please analyze the attached Accessibility Tree & "
                   "screenshot and give the Thought and Action.\nT\nScreenshot:\n")
  msgs = f.build_prompt(TASK, Observation(a11y_tree="T", error=P.FAIL_OBS_OPENWEBVOYAGER,
                                          screenshot=np.zeros((2, 2, 3), np.uint8)), hist)
  assert base.count_images(msgs) == 2 and msgs[0]["content"] == P.SYSTEM_PROMPT_ACTREE_IMAGE


def test_render_uses_the_variant_jump_action():
  assert get_format("webvoyager").render(Action(ActionKind.RESTART)) == "Thought: \n\nAction: Google"
  assert get_format("webvoyager_actree_image").render(Action(ActionKind.RESTART), "x") == "Thought: x\n\nAction: Restart"
  with pytest.raises(ValueError, match="cannot render action kind 'swipe'"):
    get_format("webvoyager").render(Action(ActionKind.SWIPE, x=0.1, y=0.1, x2=0.2, y2=0.2))


def test_empty_history_obs_text_is_a_clear_error():
  f = get_format("webvoyager")
  with pytest.raises(ValueError, match=r"history\[0\].obs_text is empty"):
    f.build_prompt(TASK, Observation(), [Step(step=0, action_text="Thought: a\nAction: Wait")])
