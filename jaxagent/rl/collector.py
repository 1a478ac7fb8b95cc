"""Rollouts: a `Policy` driving every slot of an `EnvPool`, one batched policy call per step.

Each round, the observations of all live episodes go to ONE `policy.act(observations, histories)` call (a
model batches them into one forward pass; one call per policy when several share the pool, `collect_jobs`); the
texts are parsed into actions (`parse` never raises: an unparsable text is an `invalid` action, which the env
executes as a no-op and whose reason comes back in the next observation's `error`), and the pool steps all slots
at once while slots whose episode just ended are reset with the next task in the same round, so no browser idles
while tasks remain.

An episode ends when the env says done, the agent answers (`Action.ends_episode`), it reaches
`task.max_steps` (status "truncated"), or `early_stop` gives a reason (status "completed"). A crash restarts it
from scratch (the steps of the failed attempt are dropped, the error kept in `meta["errors"]`); once the pool's
retries are exhausted it is returned with status "errored". Every task gives exactly one trajectory, in the
order of `tasks`.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.pool import EnvPool, SlotResult
from jaxagent.rl.returns import mc_return

ObsText = Callable[[types.Task, types.Observation, list[types.Step]], str]


@dataclasses.dataclass
class _Live:
  index: int  # position in its job's `tasks`
  traj: types.Trajectory
  obs: types.Observation | None = None
  job: int = 0


def _default_obs_text(parse) -> ObsText | None:
  """An agent format's `observation_text`, when `parse` is its bound `parse` method."""
  owner = getattr(parse, "__self__", None)
  return getattr(owner, "observation_text", None)


@dataclasses.dataclass
class Job:
  """One policy's episodes in `collect_jobs` (the arguments of `collect`, which see).

  `policy` may be a zero-argument callable that returns it: it is called when the job's first episode starts and
  its result dropped once its last episode ends, so that a run of several jobs holds at most two policies at a
  time (the one finishing its last episodes and the next). `parse` defaults to the policy's `fmt.parse`;
  `store` is a `TrajectoryStore` (`pipeline.rollout.Rollouts.run_jobs` also takes its path).
  """
  policy: types.Policy | Callable[[], types.Policy]
  tasks: Sequence[types.Task]
  parse: Callable[[str], types.Action] | None = None
  store: TrajectoryStore | str | None = None
  gamma: float = 1.0
  judge: types.Judge | None = None
  obs_text: ObsText | None = None
  policy_name: str = ""
  keep_screenshots: bool = True
  prepare: Callable[[types.Trajectory], None] | None = None
  early_stop: Callable[[list[types.Step]], str] | None = None


def collect(pool: EnvPool, policy: types.Policy, parse: Callable[[str], types.Action],
            tasks: Sequence[types.Task], store: TrajectoryStore | None = None, progress: bool = True, *,
            gamma: float = 1.0, judge: types.Judge | None = None, obs_text: ObsText | None = None,
            policy_name: str = "", keep_screenshots: bool = True,
            prepare: Callable[[types.Trajectory], None] | None = None,
            early_stop: Callable[[list[types.Step]], str] | None = None) -> list[types.Trajectory]:
  """Runs every task once; returns their trajectories in task order (also appended to `store` if given).

  Args:
    gamma: discount of each step's `mc_return` (`rl.returns.mc_return`; DigiRL 0.5, WebRL 0.9, Digi-Q 0.95).
    judge: fills `success` / `verdict_reason` of finished (non-errored) episodes; without one, `success`
      is left None.
    obs_text: `(task, observation, history) -> str` stored as `Step.obs_text` (default: the agent format's
      `observation_text` when `parse` is a bound `AgentFormat.parse`).
    keep_screenshots: keep screenshot arrays on the returned steps' observations (they are written to the
      store either way); False saves memory on long runs.
    prepare: called on each finished, judged trajectory before it is stored (to keep more of its observations
      in `Step.info`): every episode is in the store as soon as it ends, so a killed collection loses none.
    early_stop: `(steps so far) -> reason` checked after each step that neither ended nor truncated the
      episode (e.g. `agents.webrl.early_stop`); a non-empty reason ends it as the original's stop action does
      (VAB `run.py`): status "completed", answer "Early stop: <reason>" (what the judge reads), the reason
      in `meta["early_stop"]`.
  """
  job = Job(policy, tasks, parse, store, gamma, judge, obs_text, policy_name, keep_screenshots, prepare, early_stop)
  return collect_jobs(pool, [job], progress)[0]


def collect_jobs(pool: EnvPool, jobs: Sequence[Job], progress: bool = True) -> list[list[types.Trajectory]]:
  """Every job's tasks once, in one queue over the pool: a slot freed by one job's last episodes starts the next
  job's first, so no worker idles between policies. Each round calls each job's policy once on its live episodes.
  Returns each job's trajectories in its task order."""
  queue = collections.deque((j, i, task) for j, job in enumerate(jobs) for i, task in enumerate(job.tasks))
  remaining = collections.Counter(j for j, _, _ in queue)
  policies: dict[int, types.Policy] = {}
  parsers: dict[int, Callable[[str], types.Action]] = {}
  obs_texts: dict[int, ObsText | None] = {}
  live: dict[int, _Live] = {}
  done: list[list[types.Trajectory | None]] = [[None] * len(job.tasks) for job in jobs]
  bar = _Progress(len(queue), progress)

  def start_job(j: int) -> None:
    if j not in policies:
      job = jobs[j]
      policy = job.policy if hasattr(job.policy, "act") else job.policy()
      policies[j], parsers[j] = policy, job.parse or policy.fmt.parse
      obs_texts[j] = job.obs_text or _default_obs_text(parsers[j])

  def finish(slot: int, status: str, error: str = "") -> None:
    ep = live.pop(slot)
    job, traj = jobs[ep.job], ep.traj
    traj.status, traj.error = status, error
    traj.final_observation = ep.obs
    returns = mc_return(np.array([s.reward for s in traj.steps], np.float32), job.gamma)
    for s, g in zip(traj.steps, returns):
      s.mc_return = float(g)
    if job.judge is not None and status != "errored":
      verdict = job.judge.evaluate(traj.task, traj)
      traj.success, traj.verdict_reason = verdict.success, verdict.reason
    if job.prepare is not None:
      job.prepare(traj)
    if job.store is not None:
      job.store.append(traj)
    if not job.keep_screenshots:
      for o in [s.observation for s in traj.steps] + [traj.final_observation]:
        if o is not None:
          o.screenshot = None
    done[ep.job][ep.index] = traj
    bar.update(traj)
    remaining[ep.job] -= 1
    if not remaining[ep.job]:
      policies.pop(ep.job, None)  # a lazily loaded policy's weights go once its episodes are all done

  def started(slot: int, result: SlotResult) -> None:
    ep = live[slot]
    ep.traj.attempts = result.attempt
    ep.traj.meta["errors"] = list(result.errors)
    if result.errored:
      finish(slot, "errored", result.errors[-1] if result.errors else "errored")
      return
    ep.traj.steps = []  # a restarted episode begins again
    ep.obs = result.obs
    if not ep.traj.task.intent and result.obs.intent:  # a task whose goal the page states (MiniWoB's utterance)
      ep.traj.task = dataclasses.replace(ep.traj.task, intent=result.obs.intent)

  resets: dict[int, types.Task] = {}
  steps: dict[int, types.Action] = {}
  texts: dict[int, str] = {}
  try:
    while queue or live:
      for slot in range(len(pool)):
        if slot not in live and queue:
          j, index, task = queue.popleft()
          start_job(j)
          live[slot] = _Live(index, types.Trajectory(task, policy=jobs[j].policy_name), job=j)
          resets[slot] = task
      results = pool.advance(resets=resets, steps=steps)
      for slot in resets:
        started(slot, results[slot])
      for slot, action in steps.items():
        result, ep = results[slot], live[slot]
        job = jobs[ep.job]
        if result.errored or result.restarted:
          started(slot, result)
          continue
        history, obs_text = list(ep.traj.steps), obs_texts[ep.job]
        ep.traj.steps.append(types.Step(
            step=len(history), obs_text=obs_text(ep.traj.task, ep.obs, history) if obs_text else "",
            action_text=texts[slot], action=action, reward=result.reward, done=result.done, url=ep.obs.url,
            info=result.info, observation=ep.obs, **_tokens(texts[slot])))
        ep.obs = result.obs
        if action.kind == types.ActionKind.INVALID and not ep.obs.error:
          ep.obs.error = action.reason  # the no-op's feedback, for envs that do not echo it themselves
        if action.ends_episode:
          ep.traj.answer = action.text
        if result.done or action.ends_episode:
          finish(slot, "truncated" if result.info.get("truncated") else "completed")
        elif len(ep.traj.steps) >= ep.traj.task.max_steps:
          finish(slot, "truncated")
        elif job.early_stop is not None and (reason := job.early_stop(ep.traj.steps)):
          ep.traj.meta["early_stop"], ep.traj.answer = reason, f"Early stop: {reason}"
          finish(slot, "completed")
      resets, steps, texts = {}, {}, {}
      for j in sorted({ep.job for ep in live.values()}):
        slots = sorted(s for s, ep in live.items() if ep.job == j)
        outs = policies[j].act([live[s].obs for s in slots], [list(live[s].traj.steps) for s in slots])
        if len(outs) != len(slots):
          raise ValueError(f"policy.act returned {len(outs)} texts for {len(slots)} observations")
        for slot, text in zip(slots, outs):
          texts[slot] = text
          steps[slot] = parsers[j](text)
  finally:
    bar.close()
  return done  # type: ignore[return-value]


def _tokens(text: str) -> dict:
  """A `types.Sample` reply's token ids and log-probs as `Step` fields (none for a plain text)."""
  if not isinstance(text, types.Sample):
    return {}
  return {"prompt_ids": text.prompt_ids, "reply_ids": text.reply_ids, "reply_logprobs": text.logprobs}


class _Progress:
  """tqdm bar: episodes/s, success rate (the judge's verdict, else reward > 0) and errored count."""

  def __init__(self, total: int, enabled: bool):
    self.bar = None
    if enabled:
      import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm.tqdm(total=total, unit="ep", dynamic_ncols=True, desc="collect")
    self.start = time.monotonic()
    self.n = self.judged = self.errored = 0
    self.success = 0.0

  def update(self, traj: types.Trajectory) -> None:
    self.n += 1
    self.errored += traj.status == "errored"
    if traj.status != "errored":
      self.judged += 1
      self.success += traj.success if traj.success is not None else float(traj.trajectory_reward > 0)
    if self.bar is not None:
      rate = self.n / max(time.monotonic() - self.start, 1e-9)
      sr = f"{self.success / self.judged:.0%}" if self.judged else "n/a"
      self.bar.set_postfix_str(f"{rate:.2f} ep/s, success {sr}, errored {self.errored}", refresh=False)
      self.bar.update(1)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
