"""Lexical passage retrieval for SEEM's "w/o relational propagation" ablation (SEEM paper
§5.3: "direct lexical retrieval"), BM25 by the maintained `bm25s` library (lazy import):

    >>> idx = LexicalIndex(["Lena ran the Lyon half marathon", "Tomas adopted a beagle"])
    >>> [round(float(x), 3) > 0 for x in idx.scores("Who adopted a beagle?")]
    [False, True]

Tokens: lower case, English stop words removed (bm25s's tokenizer), no stemming; BM25 with
bm25s's defaults (Lucene variant, k1 = 1.5, b = 0.75). Scores are per passage, in input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class LexicalIndex:
    """BM25 over one conversation's passages."""

    def __init__(self, texts: Sequence[str]) -> None:
        import bm25s

        self._bm25s = bm25s
        self.n = len(texts)
        self._retriever: Any = None
        if self.n:
            corpus = bm25s.tokenize(list(texts), stopwords="en", show_progress=False)
            self._retriever = bm25s.BM25()
            self._retriever.index(corpus, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for `query` (zeros when no query term is indexed)."""
        if not self.n:
            return np.zeros(0)
        tokens = self._bm25s.tokenize(
            [query], stopwords="en", return_ids=False, show_progress=False
        )[0]
        known = [t for t in tokens if t in self._retriever.vocab_dict]
        if not known:  # bm25s fails on a query with no indexed term; no overlap = score 0
            return np.zeros(self.n)
        return np.asarray(self._retriever.get_scores(known), dtype=np.float64)
