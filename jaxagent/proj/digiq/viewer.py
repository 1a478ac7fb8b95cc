"""A static HTML page of one stored trajectory: each step's screenshot, prompt and action, and (Digi-Q) its
candidate actions ranked by Q with Q − V: the seeds' Gradio viewers (`vis/view_trajs.py`, `vis/view_actions.py`,
`reference/algorithms.md` §5.9) as one self-contained file (images inlined). CLI: `data_tools/view_trajectory.py`.

`scores.npz` (written by the Digi-Q critic stage) holds `rows` [M, 2] (trajectory index, step index), `q`
[M, N, 2] and `v` [M, 2] (both heads).
"""

from __future__ import annotations

import base64
import html
import io
from typing import Callable

import numpy as np

from jaxagent import types


def _img_tag(image: np.ndarray, width: int = 206) -> str:
  from PIL import Image  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  Image.fromarray(np.asarray(image)).save(buf, format="PNG")
  data = base64.b64encode(buf.getvalue()).decode("ascii")
  return f"<img width={width} src='data:image/png;base64,{data}'>"


def render_html(traj: types.Trajectory, load_image: Callable[[str], np.ndarray],
                scores: dict[int, tuple[np.ndarray, np.ndarray]] | None = None, title: str = "") -> str:
  """The page. `scores[step] = (q [N, 2], v [2])` ranks that step's `candidates` by max-head Q."""
  esc = html.escape
  out = [f"<!doctype html><meta charset=utf-8><title>{esc(title or traj.task.id)}</title>",
         "<style>body{font:14px sans-serif;margin:1em}td{vertical-align:top;padding:4px 8px}"
         "table.c td{border-bottom:1px solid #ddd;font-family:monospace;font-size:12px}"
         ".best{background:#e6f6e6}.step{border-top:2px solid #888;margin-top:1em}</style>",
         f"<h1>{esc(traj.task.intent)}</h1>",
         f"<p>task <code>{esc(traj.task.id)}</code> · policy {esc(traj.policy)} · status {esc(traj.status)} · "
         f"success <b>{traj.success}</b> ({esc(traj.verdict_reason)}) · {len(traj.steps)} steps</p>"]
  for k, step in enumerate(traj.steps):
    shot = _img_tag(load_image(step.image_path)) if step.image_path else "(no screenshot)"
    out.append(f"<div class=step><h3>step {step.step}</h3><table><tr><td>{shot}</td><td>"
               f"<p><b>prompt</b> <code>{esc(step.obs_text)}</code></p>"
               f"<p><b>action</b> <code>{esc(step.action_text)}</code></p>"
               f"<p>reward {step.reward} · MC return {step.mc_return:.3f}</p>")
    if step.candidates:
      q, v = scores.get(k, (None, None)) if scores else (None, None)
      order = list(range(len(step.candidates)))
      if q is not None:
        order.sort(key=lambda i: -float(np.max(q[i])))
      out.append("<table class=c><tr><th>#</th><th>candidate</th><th>Q1</th><th>Q2</th><th>max Q − max V</th></tr>")
      for rank, i in enumerate(order):
        cells = ("<td></td>" * 3 if q is None else
                 f"<td>{q[i][0]:.3f}</td><td>{q[i][1]:.3f}</td><td>{float(np.max(q[i]) - np.max(v)):+.3f}</td>")
        tag = " (dataset)" if i == 0 else ""
        out.append(f"<tr class={'best' if rank == 0 and q is not None else ''}><td>{i}{tag}</td>"
                   f"<td>{esc(step.candidates[i])}</td>{cells}</tr>")
      out.append("</table>")
      if v is not None:
        out.append(f"<p>V1 {v[0]:.3f} · V2 {v[1]:.3f}</p>")
    out.append("</td></tr></table></div>")
  return "\n".join(out)


def scores_for(npz: dict[str, np.ndarray], traj_index: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
  rows = npz["rows"]
  return {int(k): (npz["q"][r], npz["v"][r]) for r, (i, k) in enumerate(rows) if int(i) == traj_index}
