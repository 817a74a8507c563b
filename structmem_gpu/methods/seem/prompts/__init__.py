"""SEEM's prompt texts (frames, fusion, graph, retrieval, answer)."""
