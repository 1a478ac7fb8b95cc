"""The pre-training loss's attention targets: each reply's content read off the right prompt token."""

import numpy as np

from jaxagent.proj.pretrain import alignment

PIECES = [chr(c) for c in range(128)]  # a character-level "tokenizer": token c is the character chr(c)


def _encode(prompt: str, reply: str):
  ids = [ord(c) for c in prompt + reply]
  loss = [0] * len(prompt) + [1] * len(reply)
  return ids, loss, len(prompt)


def test_a_typed_string_is_read_off_its_last_occurrence_in_the_prompt():
  prompt = 'Type "xq-9" into the box. <input id="3"> </input> Type "xq-9" here.\n'
  ids, loss, start = _encode(prompt, 'do(action="Type", argument="xq-9", element="3")')
  align = alignment.alignment(ids, loss, PIECES)
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
  align = alignment.alignment(ids, loss, PIECES)
  s = start + len('do(action="Click", element="')
  assert PIECES[ids[s]] == "7"
  assert s - align[s] == prompt.index("Accept all </button>") + len("Accept all") - 1  # the 'l' of "all"
  assert np.count_nonzero(align) == 1


def test_no_source_no_target():
  ids, loss, _ = _encode("Say something.\n", 'exit(message="zzq")')
  assert not alignment.alignment(ids, loss, PIECES).any()
