"""BFCL, a leaf package: its data, the bridge to its checker (in its own venv) and its answers as calls; imported by ponder.envs and ponder.eval."""
