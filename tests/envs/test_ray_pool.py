"""RayEnvPool on a real local Ray instance (loopback only): EnvPool's bookkeeping with Ray actors as workers,
a worker SIGKILLed mid-collection losing no episode, a separate driver joining a `ray start --head` cluster
through `ray://`, `make_pool`'s backend choice, and real Chromium (the scripted expert on the bundled sites).

The bookkeeping tests run `scripted_env.ScriptedEnv`, which like a browser starts a helper process in a session
of its own, so the orphan checks are real.
"""

import ipaddress
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import ml_collections
import psutil
import pytest
import ray

from jaxagent import config_lib
from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs import backends
from jaxagent.envs import pool as pool_lib
from jaxagent.envs import ray_pool
from jaxagent.envs.sites import expert, server, tasks
from jaxagent.judges import evaluators
from jaxagent.rl import collector
from scripted_env import ScriptedEnv

pytestmark = pytest.mark.slow  # every test starts a local Ray cluster

SPEC = {"kind": f"{ScriptedEnv.__module__}:ScriptedEnv"}


def _task(i, max_steps=3, **meta):
  return types.Task(id=f"t{i}", intent=f"do {i}", site="fake", start_url=f"fake://{i}", max_steps=max_steps,
                    meta=meta)


def _say(text):
  return types.Action(types.ActionKind.TYPE, text=text)


def _fault(tmp_path, name, kind, at, times=1):
  return {"fault": {"kind": kind, "at": at, "times": times, "counter": str(tmp_path / name)}}


def _left(marker, within=5.0):
  """The command lines of the processes still carrying `marker` after `within` s (an actor's guardian sweeps
  within about 0.5 s of the actor's death)."""
  deadline = time.monotonic() + within
  while pool_lib.marked_pids(marker) and time.monotonic() < deadline:
    time.sleep(0.1)
  return [_cmdline(pid) for pid in pool_lib.marked_pids(marker)]


def _cmdline(pid):
  try:
    return " ".join(psutil.Process(pid).cmdline())[:200]
  except psutil.Error:
    return f"{pid} (gone)"


@pytest.fixture(scope="module")
def local_ray():
  """One loopback Ray instance for the module (it takes seconds to start); pools join it and leave it up."""
  ray_pool.start_local_ray(num_cpus=2)
  yield
  ray.shutdown()


@pytest.fixture(scope="module")
def pool(local_ray):
  with ray_pool.RayEnvPool({**SPEC, "step_sleep": 0.5}, num_workers=3, step_timeout=5.0, reset_timeout=8.0,
                           max_retries=1, worker_cpus=0.25) as p:
    yield p
  assert not _left(p.marker), "processes of a closed pool are still alive"


def test_local_ray_listens_on_loopback_only(local_ray):
  ray_processes = psutil.Process().children(recursive=True)
  listening = [(p.pid, c.laddr.ip) for p in ray_processes for c in _connections(p) if c.status == psutil.CONN_LISTEN]
  assert listening, "found no Ray server among this process's children"
  public = [(pid, ip) for pid, ip in listening if not _loopback(ip)]
  assert not public, f"Ray processes listen beyond loopback: {public}"


def _connections(process):
  try:
    return process.net_connections(kind="inet")
  except psutil.Error:
    return []


def _loopback(ip):
  address = ipaddress.ip_address(ip)
  return address.is_loopback or (address.version == 6 and address.ipv4_mapped is not None
                                 and address.ipv4_mapped.is_loopback)


def test_slots_step_in_parallel_and_results_align(pool):
  first = pool.reset([_task(0), None, _task(2)])
  assert first[1] is None
  assert [r.obs.url for r in (first[0], first[2])] == ["fake://0", "fake://2"]
  pool.reset({1: _task(1)})
  start = time.monotonic()
  out = pool.step([_say("a"), _say("b"), _say("c")])
  elapsed = time.monotonic() - start
  assert [r.info["echo"] for r in out] == ["a", "b", "c"]
  assert [r.obs.step for r in out] == [1, 1, 1]
  assert [r.obs.extra["pid"] for r in out] == [pool.worker_pid(i) for i in range(3)]  # each slot its own actor
  assert len({r.obs.extra["pid"] for r in out}) == 3 and os.getpid() not in {r.obs.extra["pid"] for r in out}
  assert elapsed < 0.5 * 3 * 0.9, f"3 slots x 0.5 s took {elapsed:.2f}s: not parallel"
  out = pool.step({0: _say("x")})
  assert out[0].obs.step == 2 and out[1] is None and out[2] is None
  with pytest.raises(ValueError, match="pass one per slot"):
    pool.step([_say("a")])


@pytest.mark.parametrize("kind", ["raise", "die", "hang"])
def test_crashed_dead_or_hung_actor_is_replaced_and_episode_retried(pool, tmp_path, kind):
  restarts = pool.restarts
  pool.reset([_task(0, **_fault(tmp_path, "c", kind, at=2)), _task(1), None])
  old_pid, old_marker = pool.worker_pid(0), pool._workers[0].marker  # pylint: disable=protected-access
  assert len(pool_lib.marked_pids(old_marker)) == 2, "the actor's guardian and its env's helper carry the marker"
  out = pool.step([_say("a"), _say("a"), None])
  assert out[0].obs.step == 1 and not out[0].restarted
  out = pool.step([_say("b"), _say("b"), None])
  assert out[0].restarted and out[0].attempt == 2 and not out[0].errored
  assert out[0].obs.step == 0, "a restarted episode starts again from reset"
  assert len(out[0].errors) == 1 and {"raise": "scripted crash", "die": "worker actor died",
                                      "hang": "hung"}[kind] in out[0].errors[0]
  assert out[1].obs.step == 2 and not out[1].restarted, "the other slot is untouched"
  assert pool.worker_pid(0) != old_pid and pool.restarts == restarts + 1
  assert out[0].obs.extra["pid"] == pool.worker_pid(0)
  assert not _left(old_marker), "the replaced actor's env helper outlived it"
  out = pool.step([_say("c"), None, None])  # the fresh actor carries on with the retried episode
  assert out[0].obs.step == 1 and out[0].attempt == 2


def test_retries_exhausted_gives_errored_then_slot_is_reusable(pool, tmp_path):
  out = pool.reset([_task(0, **_fault(tmp_path, "c", "raise", at="reset", times=5)), None, None])
  assert out[0].errored and out[0].obs is None
  assert out[0].attempt == 2 and len(out[0].errors) == 2  # max_retries=1: two attempts
  with pytest.raises(RuntimeError, match="no episode running"):
    pool.step({0: _say("a")})
  out = pool.reset({0: _task(5)})
  assert out[0].obs.url == "fake://5" and out[0].attempt == 1


def test_a_task_the_env_refuses_errors_at_once_without_restart(pool):
  restarts, pid = pool.restarts, pool.worker_pid(1)
  bad = types.Task(id="bad", intent="", site="fake", start_url="http://nope/")
  out = pool.reset([_task(0), bad, None])
  assert out[1].errored and out[1].attempt == 1 and "start_url must be fake://" in out[1].errors[0]
  assert pool.restarts == restarts and pool.worker_pid(1) == pid
  assert pool.reset({1: _task(1)})[1].obs.url == "fake://1"


class _Echo:
  """A policy that says the step number."""

  def act(self, observations, histories):
    return [f"step {len(h)}" for h in histories]


def test_sigkilled_actor_mid_collection_loses_no_episode(local_ray, tmp_path):
  todo = [_task(i, max_steps=4) for i in range(6)]
  store = TrajectoryStore(tmp_path / "store")
  with ray_pool.RayEnvPool({**SPEC, "step_sleep": 0.25}, num_workers=2, step_timeout=10.0, reset_timeout=10.0,
                           max_retries=2, worker_cpus=0.25) as fleet:
    victim, victim_marker = fleet.worker_pid(0), fleet._workers[0].marker  # pylint: disable=protected-access
    killed = threading.Event()

    def killer():
      """SIGKILLs slot 0's actor process 1.5 s in: each slot runs 3 episodes of ~1.2 s back to back."""
      time.sleep(1.5)
      os.kill(victim, signal.SIGKILL)
      killed.set()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    trajs = collector.collect(fleet, _Echo(), _say, todo, store=store, progress=False)
    thread.join()
    restarts, failures = fleet.restarts, list(fleet.failures)
    assert killed.is_set() and victim != fleet.worker_pid(0)
  assert [t.task.id for t in trajs] == [t.id for t in todo], "an episode was lost or duplicated"
  assert all(t.status == "completed" and len(t.steps) == 4 for t in trajs), [(t.task.id, t.status) for t in trajs]
  store.refresh()
  assert sorted(t.task.id for t in store) == sorted(t.id for t in todo), "the store misses or repeats an episode"
  assert restarts == 1 and len(failures) == 1 and "worker actor died" in failures[0], failures
  retried = [t for t in trajs if t.attempts > 1]
  assert len(retried) == 1 and "worker actor died" in retried[0].meta["errors"][0]
  assert [s.step for s in retried[0].steps] == [0, 1, 2, 3], "the retried episode starts over"
  assert not _left(victim_marker), "the killed actor's env helper outlived it"
  assert not _left(fleet.marker), "a process of the closed pool is still alive"


# ------------------------------------------------- a separate driver joins a `ray start --head` cluster


def _free_port(taken=()):
  """A free port between Ray's worker ports (10002-19999) and the kernel's ephemeral ones (32768-), where no Ray
  process of the head takes one at random while it starts."""
  while True:
    port = random.randrange(20000, 32000)
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
    if port not in taken:
      return port


def _kill_session(sid):
  for pid in psutil.pids():
    try:
      if os.getsid(pid) == sid:
        os.kill(pid, signal.SIGKILL)
    except OSError:
      pass


@pytest.fixture
def ray_head(tmp_path):
  """A Ray cluster head (`ray start --head`) on loopback with a Ray Client server: what a fleet's driver joins.
  Token authentication is on, as Ray's default; the token is this user's `~/.ray/auth_token`."""
  gcs_port = _free_port()
  client_port = _free_port(taken={gcs_port})
  env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
         "PYTHONPATH": os.pathsep.join(os.path.abspath(p or os.curdir) for p in sys.path)}
  with open(tmp_path / "head.log", "wb") as log:
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             "--node-ip-address=127.0.0.1", f"--port={gcs_port}",
                             f"--ray-client-server-port={client_port}", "--include-dashboard=false", "--num-cpus=2",
                             "--disable-usage-stats"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
  try:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and head.poll() is None:
      if b"Ray runtime started" in (tmp_path / "head.log").read_bytes():  # printed once every server is up
        with socket.socket() as s:
          if s.connect_ex(("127.0.0.1", client_port)) == 0:
            break
      time.sleep(0.5)
    else:
      pytest.fail(f"the Ray head did not start:\n{(tmp_path / 'head.log').read_text()[-3000:]}")
    yield head, f"ray://127.0.0.1:{client_port}"
  finally:
    _kill_session(head.pid)  # the head, its raylet and GCS, and the actors it started
    head.wait(10)


_DRIVER = textwrap.dedent("""
    import json, os, sys
    sys.path[:0] = {path!r}
    from jaxagent import types
    from jaxagent.envs import backends
    from jaxagent.rl import collector
    from jaxagent.envs import ray_pool
    tasks = [types.Task(id=f"t{{i}}", intent="", site="", start_url=f"fake://{{i}}", max_steps=3,
                        meta={meta!r} if i == 1 else {{}}) for i in range(4)]
    say = lambda text: types.Action(types.ActionKind.TYPE, text=text)
    class Echo:
      def act(self, observations, histories):
        return ["go"] * len(observations)
    env = dict(workers=2, step_timeout=10.0, reset_timeout=10.0, backend="ray", ray_address={address!r})
    import ml_collections
    with backends.make_pool({spec!r}, ml_collections.ConfigDict(env)) as p:
      sessions = [os.getsid(p.worker_pid(i)) for i in range(len(p))]
      trajs = collector.collect(p, Echo(), say, tasks, progress=False)
      marker = p.marker
    print(json.dumps(dict(ids=[t.task.id for t in trajs], status=[t.status for t in trajs],
                          attempts=[t.attempts for t in trajs], sessions=sessions, marker=marker)))
""")


def test_a_driver_joins_a_cluster_through_ray_client(ray_head, tmp_path):
  """`config.env.backend=ray`, `ray_address=ray://HEAD:PORT` from a fresh process: the actors run in the
  cluster's processes (the head's session), a worker that dies is replaced, and nothing is left behind."""
  head, address = ray_head
  meta = _fault(tmp_path, "c", "die", at=2)
  code = _DRIVER.format(path=sys.path, spec={**SPEC, "step_sleep": 0.1}, address=address, meta=meta)
  driver = subprocess.run([sys.executable, "-c", code], env={**os.environ, "RAY_AUTH_MODE": "token"},
                          capture_output=True, text=True, timeout=240, check=False)
  assert driver.returncode == 0, driver.stderr[-3000:]
  out = json.loads(driver.stdout.strip().splitlines()[-1])
  assert out["ids"] == ["t0", "t1", "t2", "t3"] and out["status"] == ["completed"] * 4
  assert out["attempts"] == [1, 2, 1, 1], "the episode whose actor died ran again"
  assert out["sessions"] == [head.pid] * 2, "the actors are the cluster's processes, not the driver's"
  # Through the Ray client an actor's kill goes proxy -> GCS -> the head's raylet; on a loaded 2-core machine the
  # sweep came later than the 5 s a local pool waits (CI, 2026-11-30), so it gets 30 s.
  assert not _left(out["marker"], within=30.0), "a process of the driver's pool outlived it"


def test_a_client_connection_the_server_aborts_is_retried(monkeypatch):
  """A head's client server that aborts a connection while it starts the client's server process (seen under
  load) costs a retry, not the run; the third abort is raised."""
  calls = []

  def init(address):
    calls.append(address)
    if len(calls) < 3:
      raise ConnectionAbortedError("Initialization failure from server")

  monkeypatch.setattr(ray_pool.ray, "init", init)
  ray_pool._connect("ray://head:10001", backoff_s=0.0)
  assert calls == ["ray://head:10001"] * 3
  calls.clear()

  def down(address):
    calls.append(address)
    raise ConnectionAbortedError("down")

  monkeypatch.setattr(ray_pool.ray, "init", down)
  with pytest.raises(ConnectionAbortedError, match="down"):
    ray_pool._connect("ray://head:10001", attempts=2, backoff_s=0.0)
  assert len(calls) == 2


def test_make_pool_picks_the_backend_from_config_env(local_ray):
  env = config_lib.env_block(workers=1)
  assert env.backend == "subprocess" and env.ray_address == ""
  env.backend = "ray"
  with backends.make_pool(SPEC, env) as p:
    assert isinstance(p, ray_pool.RayEnvPool) and len(p) == 1
    assert p.reset([_task(0)])[0].obs.extra["pid"] == p.worker_pid(0)
  old = ml_collections.ConfigDict(dict(workers=1, step_timeout=5.0, reset_timeout=5.0))  # before `backend`
  with backends.make_pool(SPEC, old, num_workers=1) as p:
    assert type(p) is pool_lib.EnvPool  # pylint: disable=unidiomatic-typecheck


def test_make_pool_refuses_an_unknown_backend():
  env = config_lib.env_block(workers=1)
  env.backend = "k8s"
  with pytest.raises(ValueError, match=r"config\.env\.backend='k8s'.*'subprocess'.*'ray'"):
    backends.make_pool(SPEC, env)


# ------------------------------------------------------------------ real Chromium on the bundled sites


def _chromium(marker):
  return [pid for pid in pool_lib.marked_pids(marker) if "chrom" in _cmdline(pid).split(" ")[0]]


@pytest.mark.browser
def test_scripted_expert_solves_site_tasks_through_ray_actors(local_ray, tmp_path):
  """Two Ray actors, each with its own Chromium, solve four cart tasks on one bundled site server; killed, they
  leave no browser behind."""
  chosen = [t for t in tasks.generate(seed=0)["test"] if t.profile == "text" and t.template == "shop_add_to_cart"][:4]
  policy = expert.ScriptedExpert("webrl")
  store = TrajectoryStore(tmp_path / "store")
  with server.SiteServer() as site:
    spec = {"kind": "jaxagent.envs.sites.env:SiteEnv", "profile": "text", "observation": "html",
            "oracle_targets": True, "base_url": site.base_url}
    with ray_pool.RayEnvPool(spec, num_workers=2, step_timeout=60, reset_timeout=60, worker_cpus=0.25) as fleet:
      actors = {fleet.worker_pid(0), fleet.worker_pid(1)}
      trajs = collector.collect(fleet, policy, policy.fmt.parse, chosen, store=store,
                                judge=evaluators.ProgrammaticJudge(), progress=False)
      assert fleet.restarts == 0, fleet.failures
      # An actor SIGKILLed, and one the pool kills as it kills a hung actor: no Chromium of theirs survives.
      markers = [w.marker for w in fleet._workers]  # pylint: disable=protected-access
      assert all(_chromium(m) for m in markers), "each actor should have its browser running"
      os.kill(fleet.worker_pid(0), signal.SIGKILL)
      fleet._kill(fleet._workers[1])  # pylint: disable=protected-access
      for m in markers:
        assert not _left(m), f"the browser of {m} outlived its actor"
    for task, traj in zip(chosen, trajs):
      assert traj.status == "completed" and traj.success == 1.0, (task.id, traj.verdict_reason)
      state = server.fetch_state(site.base_url, traj.steps[-1].info["session"])
      want = task.evaluator["checks"][0]["contains"]
      assert [(i["product_id"], i["size"]) for i in state["cart"]] == [(want["product_id"], want["size"])]
  assert len({t.steps[-1].info["session"] for t in trajs}) == 4
  assert len(actors) == 2 and os.getpid() not in actors
  assert not _left(fleet.marker), "a process of the closed pool outlived it"
  store.refresh()
  assert sorted(t.task.id for t in store) == sorted(t.id for t in chosen)


def _routable_address() -> str | None:
  """This machine's address as another machine would reach it (a UDP socket's chosen source; nothing is sent)."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    try:
      s.connect(("192.0.2.1", 9))
    except OSError:
      return None
    address = s.getsockname()[0]
  return None if ipaddress.ip_address(address).is_loopback else address


@pytest.mark.browser
def test_sites_served_on_a_routable_address_reach_the_fleet(local_ray, tmp_path):
  """`config.env.sites_address`: the recipes serve the bundled sites there, so actors on other machines can open
  them; here an actor opens a site served on this machine's routable address (not loopback) and solves its task."""
  address = _routable_address()
  if address is None:
    pytest.skip("this machine has no non-loopback interface to serve the sites on")
  code = ("import ml_collections; from jaxagent.pipeline import rollout; "
          f"print(rollout.site_env('text', 'html', 0, ml_collections.ConfigDict({{'sites_address': {address!r}}}))"
          "['base_url'])")
  base_url = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            check=True).stdout.strip().splitlines()[-1]
  assert base_url.startswith(f"http://{address}:"), base_url
  chosen = [t for t in tasks.generate(seed=0)["test"] if t.profile == "text" and t.template == "shop_add_to_cart"][:1]
  policy = expert.ScriptedExpert("webrl")
  with server.SiteServer(host=address) as site:
    spec = {"kind": "jaxagent.envs.sites.env:SiteEnv", "profile": "text", "observation": "html",
            "oracle_targets": True, "base_url": site.base_url}
    with ray_pool.RayEnvPool(spec, num_workers=1, step_timeout=60, reset_timeout=60, worker_cpus=0.25) as fleet:
      (traj,) = collector.collect(fleet, policy, policy.fmt.parse, chosen, judge=evaluators.ProgrammaticJudge(),
                                  progress=False)
  assert traj.status == "completed" and traj.success == 1.0, traj.verdict_reason
  assert traj.steps[0].url.startswith(f"http://{address}:")
