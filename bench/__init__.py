"""Benchmarks: ponder side by side with its peers (grpo_vs_trl.py) and against the
machine's own limits (roofline.py). Not part of the installed package."""
