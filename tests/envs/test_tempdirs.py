"""Fault injections: a browser process that is SIGKILLed, raises or closes normally leaves no temporary file
behind once the next browser has started (Playwright's profiles, Chromium's temp files, downloads)."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytestmark = pytest.mark.browser

_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from jaxagent.envs.browser import BrowserEnv
    from jaxagent.types import Task
    env = BrowserEnv(observation="som")
    env.reset(Task(id="t", intent="x", site="fixture", start_url="data:text/html,<a href=x>hi</a>"))
    ending = sys.argv[1]
    if ending == "sigkill":
      os.kill(os.getpid(), signal.SIGKILL)
    if ending == "raise":
      raise RuntimeError("the run crashed")
    env.close()
""")


def _run(tmp, ending):
  env = {**os.environ, "TMPDIR": str(tmp)}
  return subprocess.run([sys.executable, "-c", _SCRIPT, ending], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def tmp():
  """A short TMPDIR: Chromium's singleton socket lives under it, and a Unix socket path has ~107 bytes."""
  path = tempfile.mkdtemp(prefix="tdt-", dir="/tmp")
  yield path
  shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_no_temp_file_outlives_a_killed_crashed_or_closed_browser(tmp):
  killed = _run(tmp, "sigkill")
  assert killed.returncode == -9, killed.stderr
  assert os.listdir(tmp), "a killed browser process is expected to leave its temp files (nothing can remove them)"
  crashed = _run(tmp, "raise")
  assert crashed.returncode == 1 and "the run crashed" in crashed.stderr
  assert os.listdir(tmp) == [], "the next browser did not sweep the killed one's files, or the crashed one left its own"
  closed = _run(tmp, "close")
  assert closed.returncode == 0, closed.stderr
  assert os.listdir(tmp) == []
