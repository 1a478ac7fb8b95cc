"""jaxagent's own small internet: bundled sites on a local HTTP server, task suites, loaders.

  base = ensure_server()                      # one loopback server per process (free port)
  task = episode_task(task)                   # bind a bundled-site task to a fresh session on it
  suites = generate(seed=0)                   # {"train": [...], "test": [...]} over the web/text/device profiles
  tasks = load_tasks("suite/web_test.jsonl")  # validated; errors name the line and field
  bench.tasks_for("device/headline@2")       # the benchmark (`bench.py`, docs/benchmark.md)

See README.md in this directory for the sites, the URL scheme and the suites' make-up.
"""

from jaxagent.envs.sites.server import (SiteServer, ensure_server, episode_task, fetch_state, new_session,
                                        reset_session, stop_server)
from jaxagent.envs.sites.tasks import (PROFILES, TaskFileError, generate, load_tasks, select, suite_summary, validate,
                                       write_suite)
from jaxagent.envs.sites.urls import BUNDLED_SITES, PLACEHOLDER, check_site
from jaxagent.envs.sites.loaders import load_webarena, load_webvoyager
