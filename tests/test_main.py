"""The entry point: override typos name the nearest valid keys; the resolved config lands in the workdir."""

import io
import json
import os
import subprocess
import sys

import pytest
from absl import app, flags

from jaxagent import main
from launch import local

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IL = os.path.join(ROOT, "configs", "il.py")


def test_typo_in_override_names_nearest_keys():
  with pytest.raises(app.UsageError, match=r"did you mean --config\.optim\.lr"):
    main.check_overrides([f"--config={IL}", "--config.optim.lr_typo=1"])
  with pytest.raises(app.UsageError, match=r"--config\.train\.steps"):
    main.check_overrides([f"--config={IL}:smoke", "--config.train.stpes=3"])


def test_valid_overrides_pass():
  main.check_overrides([f"--config={IL}:smoke", "--config.optim.lr=0.1", "--config.data.seq_len=64"])


def test_flat_keys_cover_nested_blocks():
  keys = main.flat_keys(main.load_config_file(f"{IL}:smoke"))
  assert {"optim.lr", "data.path", "mesh.fsdp", "profile.start_step"} <= set(keys)


def test_cli_rejects_typo_and_writes_nothing(tmp_path):
  workdir = tmp_path / "w"
  proc = subprocess.run([sys.executable, "-m", "jaxagent.main", f"--config={IL}:smoke", f"--workdir={workdir}",
                         "--config.optim.lr_typo=1"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "did you mean --config.optim.lr" in proc.stderr
  assert not workdir.exists()


def test_il_with_seeds_lists_each_seeds_checkpoint_instead_of_a_type_error(tmp_path, monkeypatch, capsys):
  from jaxagent.recipes import il
  monkeypatch.setattr(il, "run", lambda cfg, workdir: os.path.join(workdir, "checkpoints", "3"))
  flags.FLAGS(["jaxagent.main", f"--config={IL}:smoke", f"--workdir={tmp_path}", "--seeds=0,1"])
  try:
    main.main([])
  finally:
    flags.FLAGS.unparse_flags()
  with open(tmp_path / "results.json") as f:
    assert json.load(f)["per_seed"] == {str(k): str(tmp_path / f"seed{k}" / "checkpoints" / "3") for k in (0, 1)}
  assert "no evaluation results to combine" in capsys.readouterr().out


@pytest.mark.parametrize("override, expected", [("train.steps=abc", "--config.train.steps='abc': expected an integer"),
                                                ("optim.lr=fast", "--config.optim.lr='fast': expected a number")])
def test_a_bad_integer_override_prints_one_line_naming_the_key(tmp_path, override, expected):
  workdir = tmp_path / "w"
  proc = subprocess.run([sys.executable, "-m", "jaxagent.main", f"--config={IL}:smoke", f"--workdir={workdir}",
                         f"--config.{override}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2  # a usage error, as argparse exits
  assert proc.stderr.strip() == f"error: {expected}"
  assert not workdir.exists()


def test_unknown_recipe_names_the_registered_ones():
  from jaxagent import recipes
  with pytest.raises(ValueError, match="choose one of"):
    recipes.get("nope")


_COORDINATOR_PROBE = """
import psutil, sys
from jaxagent.main import init_distributed
init_distributed()
port = int(sys.argv[1])
print(sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp")
              if c.status == psutil.CONN_LISTEN and c.laddr.port == port}))
"""


def test_the_jax_coordinator_listens_on_the_address_it_is_given_not_every_interface():
  import socket
  import subprocess
  import sys
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "1",
         "JAX_PROCESS_ID": "0", "JAX_PLATFORMS": "cpu"}
  env.pop("JAXAGENT_COORDINATOR_BIND", None)
  out = subprocess.run([sys.executable, "-c", _COORDINATOR_PROBE, str(port)], env=env, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  import ast
  import ipaddress
  ips = [ipaddress.ip_address(ip) for ip in ast.literal_eval(out.stdout.strip().splitlines()[-1])]
  assert ips and all((getattr(ip, "ipv4_mapped", None) or ip).is_loopback for ip in ips), ips  # not [::] / 0.0.0.0


_SLURM_TASK = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "node[001-004],other7", "SLURM_NTASKS": "16",
               "SLURM_PROCID": "5", "SLURM_LOCALID": "1"}


def test_under_slurm_the_coordinator_binds_the_address_jax_derives(monkeypatch):
  for k in [k for k in os.environ if k.startswith(("SLURM_", "OMPI_"))] + ["JAX_COORDINATOR_PORT"]:
    monkeypatch.delenv(k, raising=False)
  assert main._slurm_coordinator_address() is None  # not under SLURM: JAX's choice
  for k, v in _SLURM_TASK.items():
    monkeypatch.setenv(k, v)
  assert main._slurm_coordinator_address() == f"node001:{4242 % 4096 + 61440}"  # JAX's port from the job id
  monkeypatch.setenv("JAX_COORDINATOR_PORT", "12345")
  assert main._slurm_coordinator_address() == "node001:12345"
  monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "x")  # srun of an Open MPI program: JAX detects Open MPI first
  assert main._slurm_coordinator_address() is None


def test_the_slurm_coordinator_listens_on_the_first_node_only_not_every_interface():
  import ast
  import ipaddress
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "JAX_COORDINATOR",
                                                                  "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))}
  env.pop("JAXAGENT_COORDINATOR_BIND", None)
  env.update({**_SLURM_TASK, "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
              "SLURM_LOCALID": "0", "JAX_COORDINATOR_PORT": str(port), "JAX_PLATFORMS": "cpu"})
  out = subprocess.run([sys.executable, "-c", _COORDINATOR_PROBE, str(port)], env=env, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  ips = [ipaddress.ip_address(ip) for ip in ast.literal_eval(out.stdout.strip().splitlines()[-1])]
  assert ips and all((getattr(ip, "ipv4_mapped", None) or ip).is_loopback for ip in ips), ips  # not [::]


def test_a_run_compiles_into_a_persistent_cache_the_environment_can_move_or_turn_off(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  saved = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
  try:
    assert main.use_compilation_cache({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "jaxagent" / "xla")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jaxagent" / "xla")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.2
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    mine = str(tmp_path / "mine")
    assert main.use_compilation_cache({"JAX_COMPILATION_CACHE_DIR": mine,
                                       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1.0"}) == mine
    assert jax.config.jax_compilation_cache_dir == mine
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0  # the user's threshold stands
    jax.config.update("jax_compilation_cache_dir", saved[0])
    assert main.use_compilation_cache({"JAX_ENABLE_COMPILATION_CACHE": "false"}) is None
    assert jax.config.jax_compilation_cache_dir == saved[0]
  finally:
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])


def test_the_cache_writer_is_wrapped_only_where_jax_has_it_as_expected(monkeypatch):
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  found = main.jax_cache_writer()
  assert found is not None and found[1] is compiler._cache_write  # this JAX: wrapped in a multi-process CPU job
  assert main.write_cache_from_every_process() is False  # one process: nothing to do
  monkeypatch.setattr(compiler, "_cache_write", lambda cache_key, module_name, executable: None)
  assert main.jax_cache_writer() is None  # another signature: left alone
  monkeypatch.delattr(compiler, "_cache_write")
  assert main.jax_cache_writer() is None


# One program over both processes' devices, run with the cache on; prints what the cache did for it.
_CACHE_PROBE = """
import collections
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxagent import main
main.init_distributed()
main.use_compilation_cache()
each = main.write_cache_from_every_process()
events = collections.Counter()
jax.monitoring.register_event_listener(lambda event, **_: events.update([event]))
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.ones((2 * jax.local_device_count(), 3)))
total = float(jax.jit(lambda a: jnp.sum(a * a))(x))
print("probe", each, total, events["/jax/compilation_cache/compile_requests_use_cache"],
      events["/jax/compilation_cache/cache_hits"], flush=True)
"""


@pytest.mark.slow
def test_every_process_of_a_cpu_job_loads_its_programs_from_the_cache_on_the_next_run(tmp_path, monkeypatch):
  """Run twice as 2 processes × 2 CPU devices on an empty cache: the second run compiles nothing in either
  process (JAX alone would have process 1 compile again: process 0 writes, and process 1's keys differ)."""
  (tmp_path / "probe.py").write_text(_CACHE_PROBE)
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), ROOT]))
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
  monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  runs = []
  for _ in range(2):
    out = io.StringIO()
    assert local.launch([], num_processes=2, devices_per_process=2, module="probe", out=out) == 0, out.getvalue()
    runs.append({line.split()[0]: line.split()[2:] for line in out.getvalue().splitlines() if " probe " in line})
  for p in ("[p0]", "[p1]"):
    each, total, requests, hits = runs[0][p]
    assert (each, float(total), int(hits)) == ("True", 24.0, 0) and int(requests) >= 1, (p, runs[0])
    _, _, requests, hits = runs[1][p]
    assert int(hits) == int(requests) >= 1, (p, runs[1])


def test_a_tools_overrides_are_cast_to_each_field_and_an_unknown_field_is_refused():
  """`load_config_file(spec, overrides)`, what the data tools parse `--config.KEY=VALUE` with."""
  config = main.load_config_file("configs/webrl.py:bench", ["--config.prompt_chars=2048", "--config.tasks.templates=",
                                                            "--config.early_stop.repeats=3"])
  assert config.prompt_chars == 2048 and config.tasks.templates == "" and config.early_stop.repeats == 3
  with pytest.raises(SystemExit, match="no field 'tasks.colour'"):
    main.load_config_file("configs/webrl.py:bench", ["--config.tasks.colour=red"])
  with pytest.raises(SystemExit, match="no field 'task.colour'"):
    main.load_config_file("configs/webrl.py:bench", ["--config.task.colour=red"])
  with pytest.raises(SystemExit, match="'--config.prompt_chars=x': expected an integer"):
    main.load_config_file("configs/webrl.py:bench", ["--config.prompt_chars=x"])


def test_the_compile_barrier_is_set_only_where_jax_has_its_names_as_expected(monkeypatch):
  from jax._src import compiler, distributed  # pylint: disable=g-import-not-at-top
  assert main.wait_after_compiling() is False  # one process: nothing to wait for
  assert main.jax_compile_and_client() is None  # no coordination service in this process
  monkeypatch.setattr(distributed.global_state, "client", type("Client", (), {"wait_at_barrier": None})())
  found = main.jax_compile_and_client()
  assert found is not None and found[1] is compiler.compile_or_get_cached  # this JAX: wrapped in a CPU job
  monkeypatch.setattr(compiler, "compile_or_get_cached", lambda computation, backend, devices: None)
  assert main.jax_compile_and_client() is None  # another signature: left alone


# One program over both processes' devices; process 1 takes PROBE_SLOW_S longer than process 0 to compile it.
_SLOW_COMPILE_PROBE = """
import os, time
import jax, jax.numpy as jnp, numpy as np
from jax._src import compiler
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxagent import main
jax_compile = compiler.compile_or_get_cached
def slow_compile(backend, computation, devices, *args, **kwargs):
  if jax.process_index() == 1 and len({d.process_index for d in np.asarray(devices).flat}) > 1:
    time.sleep(float(os.environ["PROBE_SLOW_S"]))
  return jax_compile(backend, computation, devices, *args, **kwargs)
compiler.compile_or_get_cached = slow_compile
main.init_distributed()
waits = main.wait_after_compiling()
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.ones((jax.local_device_count(), 3)))
start = time.monotonic()
total = float(jax.jit(lambda a: jnp.sum(a * a))(x))
print("probe", waits, total, time.monotonic() - start, flush=True)
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_process_compiling_past_gloos_30_s_is_waited_for(tmp_path):
  """2 processes × 2 CPU devices, process 1 compiling the program over both 35 s longer than process 0 (the
  cache-loading peer of docs/results/README.md#test-suite): both run it. Without the barrier process 0 dies at
  the collective (`Gloo context initialization failed: DEADLINE_EXCEEDED ... 29.99999997s`) and process 1 hangs
  there until the coordination service's shutdown gives up (~5 min)."""
  (tmp_path / "probe.py").write_text(_SLOW_COMPILE_PROBE)
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT]), "PROBE_SLOW_S": "35",
         "JAX_ENABLE_COMPILATION_CACHE": "false"}
  proc = subprocess.Popen([sys.executable, "-m", "launch.local", "--num_processes=2", "--devices_per_process=2",
                           "--module=probe", "--", "--unused"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try:
    out, _ = proc.communicate(timeout=180)
  except subprocess.TimeoutExpired:
    proc.terminate()  # the launcher stops its processes on SIGTERM
    out, _ = proc.communicate(timeout=60)
    pytest.fail("the job did not finish in 180 s:\n" + out[-6000:])
  assert proc.returncode == 0, out[-6000:]
  probes = {line.split()[0]: line.split()[2:] for line in out.splitlines() if " probe " in line}
  assert set(probes) == {"[p0]", "[p1]"}, out[-6000:]
  for waits, total, _ in probes.values():
    assert (waits, float(total)) == ("True", 12.0)
  assert float(probes["[p0]"][2]) > 30  # process 0 did wait past Gloo's 30 s for process 1
