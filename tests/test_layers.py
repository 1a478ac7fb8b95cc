"""The import graph keeps the layers of shared/DESIGN.md: no cycles, and no import from a lower layer into a higher.

Every module under jaxagent/ is parsed with `ast`; every import counts, top-level or inside a function (a local
import hides a cycle, it does not remove it), relative or absolute, and `from pkg import name` points at
`pkg.name` when that is a submodule. A package `__init__` is a module like any other: it may import its own
submodules (they sit in its layer), but a submodule that imports names from its package's `__init__` while that
`__init__` imports it back is a cycle. Imports spelled as strings (`importlib` registries such as `recipes.get`,
code a subprocess runs) are not seen: they load on demand, after both sides have finished importing.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "jaxagent"

# Bottom up, as shared/DESIGN.md "Layers" lists them; a module takes the layer of its longest listed prefix.
# Each entry: (layer, why it sits there).
LAYERS: dict[str, tuple[int, str]] = {
    "jaxagent": (1, "the package root: an empty __init__"),
    "jaxagent.types": (1, "leaf: the shared dataclasses (Task, Action, Trajectory)"),
    "jaxagent.secrets": (1, "leaf: API keys from the environment"),
    "jaxagent.config_lib": (1, "leaf: ml_collections helpers"),
    "jaxagent.sharding": (1, "leaf: meshes and partition rules"),
    "jaxagent.local_http": (1, "leaf: the loopback HTTP helpers"),
    "jaxagent.tokens": (1, "leaf: special-token strings (`<image>`) that models/ and data/ share"),
    "jaxagent.host_memory": (1, "leaf: the host allocator set for XLA:CPU's large buffers"),
    "jaxagent.models": (2, "what a model is (models.hf included)"),
    "jaxagent.agents": (2, "how an agent writes and reads text"),
    "jaxagent.data": (3, "trajectories, stores, tokenising and batches"),
    "jaxagent.envs": (3, "environments and pools"),
    "jaxagent.openai_client": (3, "the OpenAI-compatible client the envs' and judges' peers speak"),
    "jaxagent.rl": (4, "losses and the collector"),
    "jaxagent.judges": (4, "evaluators and the LLM judge"),
    "jaxagent.train": (5, "state, step, loop, checkpoints, metrics"),
    "jaxagent.serving": (6, "loading a trained model and decoding with it"),
    "jaxagent.pipeline": (7, "the recipe layer"),
    "jaxagent.policies": (7, "the ways to act with a model"),
    "jaxagent.serve": (7, "the HTTP server over serving/"),
    "jaxagent.export": (7, "checkpoint export CLI"),
    "jaxagent.proj": (8, "one recipe's own parts (the proj/__init__ included)"),
    "jaxagent.evaluate": (8, "the evaluation CLI"),
    "jaxagent.recipes": (9, "one file per recipe, and the registry"),
    "jaxagent.main": (10, "the training CLI: the top"),
    # Around the package: nothing inside jaxagent/ may import them.
    "benchmarks": (10, "around the package"),
    "data_tools": (10, "around the package"),
    "launch": (10, "around the package"),
    "configs": (10, "around the package"),
}
OUTSIDE = ("benchmarks", "data_tools", "launch", "configs")


@dataclasses.dataclass(frozen=True)
class Edge:
  src: str
  dst: str
  where: str  # "jaxagent/x.py:12"
  local: bool  # inside a function / class body rather than at module level


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = list(path.relative_to(root).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def package_modules(root: pathlib.Path = ROOT, package: str = PACKAGE) -> dict[str, pathlib.Path]:
  return {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
  base = module.split(".") if is_package else module.split(".")[:-1]
  if level > 1:
    base = base[:len(base) - (level - 1)]
  return ".".join(base + ([target] if target else []))


def _known(name: str, modules) -> str | None:
  """The deepest prefix of `name` that is a module we track (package module or an outside top-level dir)."""
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    prefix = ".".join(parts[:i])
    if prefix in modules or (i == 1 and prefix in OUTSIDE):
      return prefix
  return None


def imports_of(module: str, source: str, filename: str, modules) -> list[Edge]:
  """Every import `module`'s source makes, resolved to the modules in `modules` it loads."""
  tree = ast.parse(source, filename=filename)
  is_package = filename.endswith("__init__.py")
  top_level = {id(node) for node in tree.body}
  # Imports under a top-level `if`/`try` still run at import time: they count as module-level.
  for node in tree.body:
    if isinstance(node, (ast.If, ast.Try)):
      top_level.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
  edges = []
  for node in ast.walk(tree):
    targets = []
    if isinstance(node, ast.Import):
      targets = [_known(alias.name, modules) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = (_resolve_relative(module, is_package, node.level, node.module) if node.level else node.module or "")
      for alias in node.names:
        sub = f"{base}.{alias.name}"
        targets.append(sub if sub in modules else _known(base, modules))
    else:
      continue
    for dst in dict.fromkeys(targets):  # `from x import a, b` of one module: one edge
      if dst is not None and dst != module:
        edges.append(Edge(module, dst, f"{filename}:{node.lineno}", id(node) not in top_level))
  return edges


def import_graph(root: pathlib.Path = ROOT, package: str = PACKAGE) -> list[Edge]:
  modules = package_modules(root, package)
  edges = []
  for name, path in modules.items():
    edges += imports_of(name, path.read_text(), str(path.relative_to(root)), modules)
  return edges


def find_cycles(edges) -> list[list[str]]:
  """One shortest cycle through each edge that lies on a cycle, deduplicated: a chain a → b → ... → a."""
  graph = collections.defaultdict(set)
  for e in edges:
    graph[e.src].add(e.dst)

  def shortest_path(start, goal):
    prev, queue = {start: None}, collections.deque([start])
    while queue:
      node = queue.popleft()
      if node == goal:
        path = []
        while node is not None:
          path.append(node)
          node = prev[node]
        return path[::-1]
      for nxt in sorted(graph[node]):
        if nxt not in prev:
          prev[nxt] = node
          queue.append(nxt)
    return None

  cycles, seen = [], set()
  for src in sorted(graph):
    for dst in sorted(graph[src]):
      back = shortest_path(dst, src)
      if back is None:
        continue
      cycle = [src] + back  # src → dst → ... → src
      ring = cycle[:-1]
      i = ring.index(min(ring))
      key = tuple(ring[i:] + ring[:i])
      if key not in seen:
        seen.add(key)
        cycles.append(list(key) + [key[0]])
  return cycles


def layer_of(module: str) -> int | None:
  parts = module.split(".")
  for i in range(len(parts), 0, -1):
    prefix = ".".join(parts[:i])
    if prefix == PACKAGE and module != PACKAGE:
      return None  # a module directly under jaxagent/ that the table does not list
    if prefix in LAYERS:
      return LAYERS[prefix][0]
  return None


def upward_imports(edges, layer=layer_of) -> list[str]:
  out = []
  for e in edges:
    k, j = layer(e.src), layer(e.dst)
    if k is not None and j is not None and j > k:
      how = "function-local import" if e.local else "import"
      out.append(f"{e.src} (layer {k}) imports {e.dst} (layer {j}) at {e.where} ({how})")
  return out


def _edge_lines(cycle, edges) -> str:
  where = {}
  for e in edges:
    where.setdefault((e.src, e.dst), []).append(e.where + (" (function-local)" if e.local else ""))
  hops = [f"    {a} → {b}: {', '.join(where[(a, b)])}" for a, b in zip(cycle, cycle[1:])]
  return " → ".join(cycle) + "\n" + "\n".join(hops)


# --- the checks on jaxagent/ --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def edges():
  return import_graph()


def test_every_module_has_a_layer():
  missing = [m for m in package_modules() if layer_of(m) is None]
  assert not missing, (f"modules without a layer: {missing}; add them to LAYERS in tests/test_layers.py (and to "
                       "the Layers list of shared/DESIGN.md)")


def test_no_import_cycles(edges):
  cycles = find_cycles(edges)
  assert not cycles, (
      "import cycles (a function-local import hides a cycle, it does not remove it); move what both sides need "
      "into the lower module, or into a new leaf both import:\n" + "\n".join(_edge_lines(c, edges) for c in cycles))


def test_no_import_from_a_lower_layer_into_a_higher(edges):
  bad = upward_imports(edges)
  assert not bad, ("imports from a lower layer into a higher one (shared/DESIGN.md, Layers); move the needed thing "
                   "down to the lower layer, or pass it in from above:\n  " + "\n  ".join(bad))


def test_the_graph_sees_known_edges(edges):
  """A guard on the parser itself: a graph that found nothing would pass the two checks above vacuously."""
  pairs = {(e.src, e.dst) for e in edges}
  assert ("jaxagent.envs.ray_pool", "jaxagent.envs.pool") in pairs
  assert ("jaxagent.agents", "jaxagent.agents.base") in pairs  # a package __init__'s imports
  assert any(e.local for e in edges) and any(d == "jaxagent.types" for _, d in pairs)
  assert len(edges) > 100


# --- the checker on synthetic packages ----------------------------------------------------------------------------

def _write(root: pathlib.Path, files: dict[str, str]):
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_checker_finds_a_planted_cycle_through_a_function_local_import(tmp_path):
  _write(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/a.py": "from pkg import b\n",
      "pkg/b.py": "def f():\n  from pkg.c import g\n  return g\n",
      "pkg/c.py": "from . import a\n",
      "pkg/d.py": "import pkg.a\n",
  })
  edges = import_graph(tmp_path, "pkg")
  assert {(e.src, e.dst, e.local) for e in edges} == {
      ("pkg.a", "pkg.b", False), ("pkg.b", "pkg.c", True), ("pkg.c", "pkg.a", False), ("pkg.d", "pkg.a", False)}
  assert find_cycles(edges) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
  assert "pkg/b.py:2 (function-local)" in _edge_lines(find_cycles(edges)[0], edges)


def test_checker_resolves_relative_and_package_imports(tmp_path):
  _write(tmp_path, {
      "pkg/__init__.py": "from pkg.sub import x  # an __init__ importing its own submodule\n",
      "pkg/sub/__init__.py": "from .x import VALUE\n",
      "pkg/sub/x.py": "from ..y import thing\nVALUE = 1\n",
      "pkg/y.py": "import os\nfrom pkg.sub import VALUE\n",
  })
  edges = import_graph(tmp_path, "pkg")
  assert {(e.src, e.dst) for e in edges} == {
      ("pkg", "pkg.sub.x"), ("pkg.sub", "pkg.sub.x"), ("pkg.sub.x", "pkg.y"), ("pkg.y", "pkg.sub")}
  assert find_cycles(edges) == [["pkg.sub", "pkg.sub.x", "pkg.y", "pkg.sub"]]


def test_checker_reports_an_upward_import(tmp_path):
  _write(tmp_path, {"pkg/__init__.py": "", "pkg/low.py": "def f():\n  import pkg.high\n", "pkg/high.py": ""})
  layers = {"pkg.low": 1, "pkg.high": 2}
  bad = upward_imports(import_graph(tmp_path, "pkg"), layer=layers.get)
  assert bad == ["pkg.low (layer 1) imports pkg.high (layer 2) at pkg/low.py:2 (function-local import)"]


def test_layer_table_matches_the_design():
  assert layer_of("jaxagent.models.hf.llama") == 2 and layer_of("jaxagent.models") == 2
  assert layer_of("jaxagent.proj.digiq.critic") == 8 and layer_of("jaxagent.recipes") == 9
  assert layer_of("jaxagent.not_listed") is None
