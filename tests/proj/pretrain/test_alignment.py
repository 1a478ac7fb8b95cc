"""The pre-training loss's attention targets: each reply's content read off the right prompt token."""

import numpy as np
import pytest

from jaxagent.agents.autoui_text import AutoUIText, element_tap, screen_prompt
from jaxagent.proj.pretrain import alignment
from jaxagent.types import Action, ActionKind

PHONE = AutoUIText()
PIECES = [chr(c) for c in range(0x2100)]  # a character-level "tokenizer": token c is the character chr(c)


def _encode(prompt: str, reply: str):
  ids = [ord(c) for c in prompt + reply]
  loss = [0] * len(prompt) + [1] * len(reply)
  return ids, loss, len(prompt)


def test_a_typed_string_is_read_off_its_last_occurrence_in_the_prompt():
  prompt = 'Type "xq-9" into the box. <input id="3"> </input> Type "xq-9" here.\n'
  ids, loss, start = _encode(prompt, 'do(action="Type", argument="xq-9", element="3")')
  align, _, _ = alignment.alignment(ids, loss, PIECES)
  reply = prompt + 'do(action="Type", argument="'
  for k, ch in enumerate("xq-9"):
    s = len(reply) + k
    assert align[s] > 0 and ids[s - align[s]] == ids[s]
    assert s - align[s] == prompt.rindex('"xq-9"') + 1 + k  # the later of the two occurrences
  assert not align[:start].any()
  assert align[prompt.__len__() + len('do(action="Type", argument="xq-9", element="')] == 0  # an input: no text


def test_an_element_id_is_read_off_the_last_word_of_its_element():
  prompt = '<a id="12"> Home </a> <button id="7" type="submit"> Accept all </button> Click "Accept all".\n'
  ids, loss, start = _encode(prompt, 'do(action="Click", element="7")')
  align, _, _ = alignment.alignment(ids, loss, PIECES)
  s = start + len('do(action="Click", element="')
  assert PIECES[ids[s]] == "7"
  assert s - align[s] == prompt.index("Accept all </button>") + len("Accept all") - 1  # the 'l' of "all"
  assert np.count_nonzero(align) == 1


def test_no_source_no_target():
  ids, loss, _ = _encode("Say something.\n", 'exit(message="zzq")')
  assert not any(a.any() for a in alignment.alignment(ids, loss, PIECES))


def test_an_element_looked_up_by_name_points_back_at_the_name_in_the_instruction():
  prompt = 'Task Instruction: Open "Acorn Mug".\n<a id="12"> Acorn Mug </a> <a id="13"> Acorn </a> <input placeholder="x y">\n'
  ids, loss, start = _encode(prompt, 'do(action="Click", element="12")')
  align, name, _ = alignment.alignment(ids, loss, PIECES)
  s = start + len('do(action="Click", element="')
  assert s - align[s] == prompt.index("Mug </a>") + 2  # on the page
  assert s - name[s] == prompt.index('Mug".') + 2  # in the instruction: the quoted name's last character
  assert np.count_nonzero(name) == 1


def test_a_value_is_read_after_the_element_the_instruction_names():
  page = '<a id="1"> Tern Lamp </a> $5.00 4.5 / 5 <a id="2"> Wren Mug </a> $7.00 4.5 / 5 <a id="3"> Ox Cup </a> $9.00 4.5'
  prompt = page + '\nTask Instruction: What is the rating of "Wren Mug"?\n'
  ids, loss, start = _encode(prompt, 'exit(message="4.5")')
  align, name, _ = alignment.alignment(ids, loss, PIECES)
  s = start + len('exit(message="')
  assert s - align[s] == prompt.index("4.5", prompt.index("Wren Mug")), "the rating after Wren Mug, not the last one"
  assert s - name[s] == prompt.index('Mug"?') + 2
  said, said_name, _ = alignment.alignment(*_encode('Answer with "4.5".\n', 'exit(message="4.5")')[:2], PIECES)
  assert said.any() and (said_name == said).all()  # a string copied from the instruction: the token copied


def test_value_links_point_a_listings_values_at_its_name():
  text = '<a id="2"> Wren Mug </a> $7.00 4.5 <nav>'
  links = alignment.value_links([ord(c) for c in text], PIECES)
  g = text.index("Mug") + 2
  for k, ch in enumerate(text):
    want = k - g if (k > text.index("</a>") + 3 and k < text.index("<nav>") and ch.isalnum()) else 0
    assert links[k] == want, (k, ch)


@pytest.mark.parametrize("query", ['Open \u201cAcorn Mug\u201d.', "Open Acorn Mug.", 'Open "Acorn Mug".'])
def test_the_name_is_found_in_the_instruction_however_it_quotes(query):
  prompt = f'Task Instruction: {query}\n<a id="12"> Acorn Mug </a> <a id="13"> Mug </a>\n'
  ids, loss, start = _encode(prompt, 'do(action="Click", element="12")')
  _, name, _ = alignment.alignment(ids, loss, PIECES)
  s = start + len('do(action="Click", element="')
  assert s - name[s] == prompt.index("Mug") + 2


def test_a_notes_name_is_copied_and_the_id_looks_it_up_where_the_note_wrote_it():
  prompt = 'Task Instruction: Open \u201cAcorn Mug\u201d.\n<a id="12"> Acorn Mug </a> <a id="13"> Mug </a>\n'
  reply = '# Note: I will click "Acorn Mug".\ndo(action="Click", element="12")'
  ids, loss, start = _encode(prompt, reply)
  align, name, _ = alignment.alignment(ids, loss, PIECES)
  noted = start + reply.index("Acorn Mug")
  for k in range(len("Acorn Mug")):  # the note copies the name (its last occurrence before: on the page)
    assert ids[noted + k - align[noted + k]] == ids[noted + k] and align[noted + k] > 0
  s = start + reply.index('12")')
  assert s - align[s] == prompt.index("Mug </a>") + 2  # the id: read off the page's element
  assert s - name[s] == noted + len("Acorn Mug") - 1  # looked up by the name the note wrote


def test_a_typed_argument_is_copied_from_its_note():
  prompt = 'Task Instruction: Type \u201cxq-9\u201d into the \u201cName\u201d field.\n<input id="3"> </input>\n'
  reply = '# Note: I will type "xq-9" into the field.\ndo(action="Type", argument="xq-9", element="3")'
  ids, loss, start = _encode(prompt, reply)
  align, _, _ = alignment.alignment(ids, loss, PIECES)
  noted, arg = start + reply.index("xq-9"), start + reply.rindex("xq-9")
  for k in range(4):
    assert noted + k - align[noted + k] == prompt.index("xq-9") + k  # the note: from the instruction
    assert arg + k - align[arg + k] == noted + k  # the argument: from the note


def test_a_name_written_out_in_full_spans_its_tokens_where_the_look_up_points():
  prompt = ('Task Instruction: Open \u201cCandle F49\u201d.\n<a id="12"> Candle M49 </a> <a id="13"> Candle F49 </a>'
            ' <a id="14"> F49 </a>\n')
  reply = '# Note: I will click "Candle F49".\ndo(action="Click", element="13")'
  ids, loss, start = _encode(prompt, reply)
  _, name, spans = alignment.alignment(ids, loss, PIECES)
  s = start + reply.index('13")')
  named = s - name[s]
  assert named == start + reply.index('F49"') + 2  # the note's last character
  assert spans[named] == len("Candle F49")  # the whole name, one token a character here
  assert np.count_nonzero(spans) == 1
  # the instruction names it when the note does not quote it; a name not written out in full spans nothing
  for query, want in (('Open "Candle F49".', len("Candle F49")), ('Open "F49".', 0)):
    text = f'Task Instruction: {query}\n<a id="13"> Candle F49 </a>\n'
    ids, loss, start = _encode(text, 'do(action="Click", element="13")')
    _, name, spans = alignment.alignment(ids, loss, PIECES)
    s = start + len('do(action="Click", element="')
    assert spans[s - name[s]] == want


def test_the_phones_tap_reads_its_id_off_the_element_the_goal_names():
  prompt = screen_prompt('Open "Wren Lamp".', '<a id="12"> Acorn Mug </a> <a id="13"> Wren Lamp </a>')
  reply = PHONE.render(Action(ActionKind.CLICK, element=13))
  ids, loss, start = _encode(prompt, reply)
  align, name, _ = alignment.alignment(ids, loss, PIECES)
  for s in (start + reply.index("13"), start + reply.rindex("13")):  # the touch and the lift point
    assert s - align[s] == prompt.index("Lamp </a>") + 3  # the 'p' of the element's last word
    assert s - name[s] == prompt.index('Lamp".') + 3  # the goal's name
  assert np.count_nonzero(align) == 2


def test_the_phones_typed_text_is_copied_from_the_goal_not_the_previous_decision():
  prompt = screen_prompt("Search for \u201cxq-9\u201d.", '<input id="3" type="search"> </input>', [element_tap(3)])
  reply = PHONE.render(Action(ActionKind.TYPE, text="xq-9"))
  ids, loss, start = _encode(prompt, reply)
  align, name, _ = alignment.alignment(ids, loss, PIECES)
  typed = start + reply.index("xq-9")
  for k in range(4):
    assert typed + k - align[typed + k] == prompt.index("xq-9") + k
  assert (name[typed:typed + 4] == align[typed:typed + 4]).all()  # copied from the goal: the token copied
  assert np.count_nonzero(align) == 4
