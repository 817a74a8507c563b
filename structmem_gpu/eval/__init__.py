"""Evaluation: answering, judging, metrics, reports, plots."""
