"""One policy server for the serving tests: a random tiny VLM (the IL recipe's shapes) behind our FastAPI app on
a real loopback port, shared by the module's tests (building the model and compiling the sampler dominate)."""

import pytest

from jaxagent import serve
from jaxagent.serving.continuous import ContinuousEngine
from jaxagent.serving.checkpoint import random_policy
from jaxagent.serving.engine import Engine


@pytest.fixture(scope="session")
def policy():
  return random_policy("vlm", seed=0)


@pytest.fixture(scope="session")
def server(policy):
  engine = Engine(policy, max_batch=8, max_new_tokens=64, max_prompt_tokens=4096)
  batcher = ContinuousEngine(engine)
  limits = serve.Limits(max_request_bytes=2 * 2**20, max_images=4)
  app = serve.create_app(batcher, "tiny-vlm", limits=limits)
  with serve.RunningServer(app) as running:
    running.engine, running.batcher, running.app = engine, batcher, app
    yield running
  batcher.close()
