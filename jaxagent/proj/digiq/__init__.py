"""Digi-Q's own parts: the critic's inputs and training, representations, candidate actions, the viewer."""
