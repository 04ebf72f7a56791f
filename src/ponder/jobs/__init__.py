"""The flows a command runs, importable from Python: train (with warm-up, resume and
the Ray choice), demo, pipeline, the shared warm-up, improve, sequence. They sit on
top of the trainers (ponder.train) and evaluation (ponder.eval) and build their
parts with ponder.wiring and ponder.jobs.parts."""
