"""A run's record: the metrics log (metrics.jsonl, its one reader), trackers
(TensorBoard, Weights & Biases), progress lines and plots. Below both ponder.train
and ponder.eval."""
