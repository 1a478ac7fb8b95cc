"""OpenWebVoyager's own parts: its compact observation, trajectories → samples, data mixing, retry-until-success."""
