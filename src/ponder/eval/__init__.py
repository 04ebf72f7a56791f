"""Evaluation: run a policy on held-out tasks, score, summarise, report."""

from ponder.eval.metrics import mean, standard_error, summarise
from ponder.eval.report import metrics_table, trajectory_table
from ponder.eval.runner import EvalInputError, EvalResult, evaluate, held_out_recipe, save_result

__all__ = ["EvalInputError", "EvalResult", "evaluate", "held_out_recipe", "mean", "metrics_table", "save_result", "standard_error", "summarise",
           "trajectory_table"]
