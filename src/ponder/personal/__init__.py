"""Per-user adapters trained from feedback (issue 27, items 1 and 2).

- store.py: `AdapterStore`, versions of each user's LoRA adapter (PEFT's layout,
  written atomically) and their metadata, interactions and feedback, in SQLite.
- feedback.py: feedback rows -> preference pairs (pure functions).
- learn.py: `update_user`, DPO on a user's pairs that trains only that user's
  adapter, anchored to the base by the DPO reference (the base, adapters disabled).
- config.py: `PersonalConfig`, the update's settings.
- cli.py: `ponder personal list | update | rollback`.

Nothing is imported here: the store is standard library only, so `ponder personal
list` (and a store writer in a crash test) starts without loading torch.
"""
