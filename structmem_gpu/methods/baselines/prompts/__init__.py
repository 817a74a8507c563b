"""Prompt texts of the baselines (graph memory, flat, turn RAG, full context)."""
