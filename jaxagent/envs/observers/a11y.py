"""The accessibility tree in OpenWebVoyager's form (`reference/algorithms.md` §1.2).

Nodes come from CDP `Accessibility.getFullAXTree`; their bounds from one `DOMSnapshot.captureSnapshot` (the
originals ask `getBoundingClientRect` once per node, N round trips; the snapshot gives the same layout boxes in
one). Then, as in `MinorJerry/OpenWebVoyager:WebVoyager/utils_webarena.py`:
- nodes with no box, an empty box, or less than 0.8 of their box inside the viewport are removed and their
  children re-parented (the root is always kept). The original computes `overlap / width * height` (an
  operator-precedence slip); we use the intended `overlap / (width * height)`;
- the DFS drops nodes whose name is empty, whose role is `gridcell`, or whose name is a substring of the nearest
  kept ancestor's name with role StaticText / heading / image / generic; kept nodes are numbered from 1;
- the DFS stops descending once more than 300 nodes are numbered;
- lines read `\\t*depth [id] role 'name' prop: val ...` without the ignored properties; then WebVoyager's
  `clean_accesibility_tree` drops a line repeating the previous kept line's role and (contained) name.
"""

from __future__ import annotations

import re
from typing import Any

IGNORED_PROPERTIES = ("focusable", "editable", "readonly", "level", "settable", "multiline", "invalid",
                      "hiddenRoot", "hidden", "controls", "labelledby", "describedby")
VIEWPORT_RATIO = 0.8
MAX_NODES = 300
_REDUNDANT_ROLES = ("StaticText", "heading", "image", "generic")
_CLEAN_PATTERN = re.compile(r"^\[\d+\]\s(\w+)\s'([^']+)'")


def fetch(page, cdp) -> tuple[list[dict[str, Any]], dict[int, list[float]], tuple[float, float]]:
  """AX nodes of the main frame, layout boxes by backend node id (viewport CSS px), and the viewport size."""
  nodes = cdp.send("Accessibility.getFullAXTree")["nodes"]
  snap = cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": [], "includeDOMRects": True})
  doc = snap["documents"][0]
  backend_ids = doc["nodes"]["backendNodeId"]
  sx, sy = doc.get("scrollOffsetX", 0.0), doc.get("scrollOffsetY", 0.0)
  bounds = {}
  for node_index, (x, y, w, h) in zip(doc["layout"]["nodeIndex"], doc["layout"]["bounds"]):
    bounds.setdefault(backend_ids[node_index], [x - sx, y - sy, w, h])
  viewport = tuple(page.evaluate("[window.innerWidth, window.innerHeight]"))
  return nodes, bounds, viewport


def viewport_ratio(bound: list[float], viewport: tuple[float, float]) -> float:
  x, y, w, h = bound
  overlap_w = max(0.0, min(x + w, viewport[0]) - max(x, 0.0))
  overlap_h = max(0.0, min(y + h, viewport[1]) - max(y, 0.0))
  return overlap_w * overlap_h / (w * h)


def build_tree(nodes: list[dict[str, Any]], bounds: dict[int, list[float]], viewport: tuple[float, float],
               ratio: float = VIEWPORT_RATIO, max_nodes: int = MAX_NODES,
               keep_unnamed: tuple[str, ...] = ()) -> tuple[str, dict[int, dict[str, Any]]]:
  """AX nodes -> (tree text, {id: {union_bound, text, backend_id, role, name}}), ids from 1 in DFS order.

  `keep_unnamed` lists roles kept even without a name. The original drops every unnamed node, so a text box
  with no associated label (common on MiniWoB) cannot be referred to; pass e.g. ("textbox", "combobox").
  """
  unique, seen = [], set()
  for node in nodes:  # a few nodes repeat in CDP's answer
    if node["nodeId"] not in seen:
      seen.add(node["nodeId"])
      unique.append(node)
  if not unique:
    return "", {}
  by_id = {n["nodeId"]: n for n in unique}
  root = unique[0]

  def union_bound(node):
    if node is root:
      return [0.0, 0.0, 10.0, 10.0]  # the originals' convention: the root is always in view
    return bounds.get(node.get("backendDOMNodeId"))

  def in_view(node) -> bool:
    b = union_bound(node)
    return bool(b) and b[2] > 0 and b[3] > 0 and viewport_ratio(b, viewport) >= ratio

  def children(node):  # children after removing out-of-view nodes (their own children take their place)
    for cid in node.get("childIds", []):
      child = by_id.get(cid)
      if child is None:
        continue
      if in_view(child):
        yield child
      else:
        yield from children(child)

  info: dict[int, dict[str, Any]] = {}
  lines: list[str] = []

  def dfs(node, depth: int, parent_name: str) -> None:
    role = node.get("role", {}).get("value", "")
    name = node.get("name", {}).get("value")
    named = isinstance(name, str) and bool(name.strip())
    valid = (named or (role in keep_unnamed and isinstance(name, str))) and role != "gridcell" and not (
        named and name.strip() in parent_name and role in _REDUNDANT_ROLES)
    if valid:
      props = []
      for prop in node.get("properties", []):
        if prop.get("name") in IGNORED_PROPERTIES or "value" not in prop.get("value", {}):
          continue
        props.append(f'{prop["name"]}: {prop["value"]["value"]}')
      node_str = f"{role} {name!r}" + (" " + " ".join(props) if props else "")
      node_id = len(info) + 1
      info[node_id] = {"union_bound": union_bound(node), "text": node_str, "backend_id": node.get("backendDOMNodeId"),
                       "role": role, "name": name}
      lines.append("\t" * depth + f"[{node_id}] {node_str}")
    for child in children(node):
      if len(info) > max_nodes:
        break
      dfs(child, depth + 1 if valid else depth, name if valid else parent_name)

  dfs(root, 0, "root")
  return clean_tree("\n".join(lines)), info


def clean_tree(tree: str) -> str:
  """WebVoyager's `clean_accesibility_tree`: of two consecutive same-role lines whose names contain one
  another, keep the longer line."""
  kept: list[int] = []
  prev_role = prev_name = None
  lines = tree.split("\n")
  for i, line in enumerate(lines):
    match = _CLEAN_PATTERN.match(line.strip())
    if prev_role and match:
      role, name = match.groups()
      if role == prev_role and (name in prev_name or prev_name in name):
        if len(line) >= len(lines[kept[-1]]):
          kept.pop()
        else:
          continue
    kept.append(i)
    if match:
      prev_role, prev_name = match.groups()
  return "\n".join(lines[i] for i in kept)


def observe(page, cdp, keep_unnamed: tuple[str, ...] = ()) -> tuple[str, dict[int, dict[str, Any]]]:
  return build_tree(*fetch(page, cdp), keep_unnamed=keep_unnamed)
