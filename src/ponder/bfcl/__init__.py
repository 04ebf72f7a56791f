"""BFCL: data, the adapter that runs ponder policies on it, and the bridge to its own checker."""
