// Removes the set-of-marks overlays som.js drew (WebVoyager removes them after the model call).
() => {
  (window.__jaxagentMarks || []).forEach((m) => m.remove());
  window.__jaxagentMarks = [];
}
