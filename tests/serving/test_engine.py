"""`Engine` batching details that the HTTP tests do not see: the decode budget each sampler call compiles."""

from jaxagent.serving import engine as engine_lib
from jaxagent.serving.checkpoint import random_policy


def test_decode_budget_is_the_request_rounded_up_to_32_tokens():
  assert [engine_lib._decode_bucket(n) for n in (1, 32, 33, 133, 160, 161)] == [32, 32, 64, 160, 160, 192]
  # An untrained decoder rarely emits EOS at temperature 2: the row runs to the request's limit, and the sampler
  # call was compiled for 160 new tokens (a power-of-two budget would have decoded 256).
  eng = engine_lib.Engine(random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128),
                          max_batch=2, max_new_tokens=160)
  out = eng.generate([engine_lib.GenerationRequest(prompt="hello", max_tokens=160, temperature=2.0)])[0]
  assert out.completion_tokens <= 160
  assert {shape[2] for shape in eng._shapes} == {160}  # pylint: disable=protected-access
