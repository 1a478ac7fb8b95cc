"""`ScriptedEnv`: a small deterministic env whose faults a task scripts, for the env pool tests.

Like a browser it starts a helper process in a session of its own, so the pools' orphan checks are real.
"""

import os
import pathlib
import subprocess
import time

from jaxagent import types


class ScriptedEnv:
  """Counts steps; `task.meta` scripts faults. A fault fires only while its counter file has fewer lines than
  `times`, so a retry of the same task can succeed (the counter lives on disk, shared by all attempts)."""

  def __init__(self, step_sleep: float = 0.0):
    self.step_sleep = step_sleep
    self.helper = subprocess.Popen(["sleep", "600"], start_new_session=True)  # like Chromium: own session
    self.task = None
    self.t = 0

  def _fault(self, where):
    fault = self.task.meta.get("fault")
    if not fault or fault["at"] != where:
      return
    counter = pathlib.Path(fault["counter"])
    fired = counter.read_text().count("\n") if counter.exists() else 0
    if fired >= fault.get("times", 1):
      return
    with counter.open("a") as f:
      f.write("x\n")
    if fault["kind"] == "raise":
      raise RuntimeError(f"scripted crash at {where}")
    if fault["kind"] == "hang":
      time.sleep(600)
    if fault["kind"] == "die":
      os._exit(3)

  def _obs(self):
    return types.Observation(url=self.task.start_url, intent=self.task.intent, step=self.t,
                             extra={"pid": os.getpid()})

  def reset(self, task):
    if not task.start_url.startswith("fake://"):
      raise ValueError(f"Task {task.id!r}: start_url must be fake://...")
    self.task, self.t = task, 0
    self._fault("reset")
    return self._obs()

  def step(self, action):
    self.t += 1
    time.sleep(self.step_sleep)
    self._fault(self.t)
    done = self.t >= self.task.max_steps
    return self._obs(), float(done), done, {"echo": action.text}

  def close(self):
    self.helper.kill()
