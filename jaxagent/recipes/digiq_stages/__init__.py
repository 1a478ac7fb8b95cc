"""Digi-Q's stages (one module per concern); `jaxagent.recipes.digiq` runs them in order."""
