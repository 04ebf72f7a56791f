"""Trainers and their parts: RL (update, batches, sampler, checkpoints, validation), SFT, DPO, data selection, continual learning; Ray actors in train/ray/."""
