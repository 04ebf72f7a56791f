"""BFCL as a benchmark: the adapter that runs ponder policies on its categories and the suite (data and checker live in ponder.bfcl)."""
