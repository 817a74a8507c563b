"""Lexical metrics against hand-computed values (docs/evaluation.md "Lexical metrics")."""

from __future__ import annotations

import pytest

from structmem_gpu.eval.metrics import (
    bleu1,
    f1_locomo,
    f1_mem0,
    lexical_scores,
    normalize_answer,
    says_not_mentioned,
    simple_tokenize,
    token_f1_locomo,
)

# (category, gold, prediction, LoCoMo F1, Mem0 F1, Mem0 BLEU-1): the LoCoMo and Mem0 scorers
# on the same pairs, row by row.
WORKED_TABLE = [
    (4, "mental health", "Mental health awareness.", 0.8, 0.8, 0.5),
    (4, "running", "She was running races", 0.4, 0.4, 0.25),
    (2, "7 May 2023", "May 7, 2023", 1.0, 1.0, 0.75),
    (2, str(2022), "In 2022", 0.667, 0.667, 0.5),
    (
        1,
        "pottery, camping, painting, swimming",
        "painting, pottery and swimming",
        0.583,
        0.75,
        0.536,
    ),
    (
        3,
        "LIkely no; though she likes reading, she wants to be a counselor",
        "Likely no",
        1.0,
        0.154,
        0.002,
    ),
]


@pytest.mark.parametrize("cat,gold,pred,f1_loc,f1_m0,b1", WORKED_TABLE)
def test_worked_comparison_table(
    cat: int, gold: str, pred: str, f1_loc: float, f1_m0: float, b1: float
) -> None:
    s = lexical_scores(pred, gold, cat)
    assert round(s.f1_locomo, 3) == f1_loc
    assert s.f1_mem0 is not None and round(s.f1_mem0, 3) == f1_m0
    assert s.bleu1 is not None and round(s.bleu1, 3) == b1


def test_category5_scores_every_lexical_metric_by_the_not_mentioned_rule() -> None:
    # LoCoMo's abstention rule for F1 and BLEU-1 alike, so that all-category averages
    # aggregate as SEEM's tables do (adversarial F1 96.9, BLEU-1 over 1,986 questions).
    s = lexical_scores("Not mentioned in the conversation", None, 5)
    assert (s.f1_locomo, s.f1_mem0, s.bleu1) == (1.0, 1.0, 1.0)
    wrong = lexical_scores("Yes, she did", "ignored gold", 5)
    assert (wrong.f1_locomo, wrong.f1_mem0, wrong.bleu1) == (0.0, 0.0, 0.0)
    assert says_not_mentioned("There is no information available about it")


def test_normalisation_example_and_stemming() -> None:
    assert normalize_answer("The Sunday, before 25 May 2023!") == "sunday before 25 may 2023"
    assert normalize_answer("Cats and dogs") == "cats dogs"  # "and" is removed too
    assert token_f1_locomo("running races paintings", "run race paint") == 1.0


def test_locomo_f1_is_multiset_and_mem0_is_set() -> None:
    # pred "paris paris" vs gold "paris": multiset P = 1/2 -> F1 0.667; set -> 1.0
    assert round(token_f1_locomo("paris paris", "paris"), 3) == 0.667
    assert f1_mem0("paris paris", "paris") == 1.0


def test_category_rules() -> None:
    assert f1_locomo("Likely no", "Likely no; a rationale", 3) == 1.0  # cut at ';'
    assert f1_locomo("Likely no", "Likely no; a rationale", 4) < 1.0  # not for other categories
    assert f1_locomo("kiwi, fig", "fig, kiwi", 1) == 1.0  # comma split on both sides
    assert f1_locomo("kiwi", "fig, kiwi", 1) == 0.5  # recall-oriented partial credit


def test_mem0_tokenizer_keeps_other_punctuation_and_empty_is_zero() -> None:
    assert simple_tokenize("No; maybe. Yes!") == ["no;", "maybe", "yes"]
    assert f1_mem0("", "gold") == 0.0 and f1_mem0("pred", "") == 0.0
    assert bleu1("", "gold") == 0.0 and bleu1("pred", None) == 0.0
    assert f1_locomo("", "gold", 4) == 0.0


# ---- BLEU-1 = the official value (nltk.word_tokenize: Punkt sentences, then words) --------
@pytest.fixture(scope="module")
def official_word_tokenize():
    """nltk.word_tokenize itself, with a punkt_tab/english directory written to a temporary
    NLTK data path from the installed model (no download; the data is never fetched)."""
    import tempfile
    from pathlib import Path

    import nltk
    from punkt.data import english as model

    root = Path(tempfile.mkdtemp(prefix="punkt_tab_test_"))
    lang = root / "tokenizers" / "punkt_tab" / "english"
    lang.mkdir(parents=True)
    (lang / "abbrev_types.txt").write_text("\n".join(sorted(model.ABBREV_TYPES)) + "\n")
    (lang / "sent_starters.txt").write_text("\n".join(sorted(model.SENT_STARTERS)) + "\n")
    (lang / "collocations.tab").write_text(
        "\n".join(f"{a}\t{b}" for a, b in sorted(model.COLLOCATIONS)) + "\n"
    )
    (lang / "ortho_context.tab").write_text(
        "\n".join(f"{k}\t{v}" for k, v in sorted(model.ORTHO_CONTEXT.items())) + "\n"
    )
    nltk.data.path.insert(0, str(root))
    try:
        yield nltk.word_tokenize
    finally:
        nltk.data.path.remove(str(root))


TOKENIZER_CASES = [
    '"Twice."!',
    "Twice.",
    "She went on 7 May 2023. Then she left for Paris.",
    "Mr. Smith arrived at 5 p.m. on Monday. He stayed.",
    'Dr. Jones said: "No." I agree!',
    "In 2023.",
    "melanie painted a sunset... then a lake. it was 2022.",
    "Caroline: yes! She loves it. Really?",
]


@pytest.mark.parametrize("text", TOKENIZER_CASES)
def test_word_tokenize_equals_nltk_word_tokenize(text: str, official_word_tokenize) -> None:
    from structmem_gpu.eval.metrics import word_tokenize

    for t in (text, text.lower()):
        assert word_tokenize(t) == official_word_tokenize(t)


def _official_bleu1(pred: str, gold: str, tok) -> float:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    return float(
        sentence_bleu(
            [tok(gold.lower())],
            tok(pred.lower()),
            weights=(1, 0, 0, 0),
            smoothing_function=SmoothingFunction().method1,
        )
    )


@pytest.mark.parametrize(
    "pred,gold",
    [
        ('"Twice."!', "Twice."),
        ("She moved in 2023. Then she left.", "2023"),
        ("7 May 2023.", "7 May 2023"),
        ("Pottery. Camping. Painting.", "pottery, camping, painting"),
    ],
)
def test_bleu1_equals_the_official_value(pred: str, gold: str, official_word_tokenize) -> None:
    assert bleu1(pred, gold) == pytest.approx(_official_bleu1(pred, gold, official_word_tokenize))


def test_bleu1_trailing_punctuation_hand_computed() -> None:
    # '"twice."!' -> ``, twice, ., ``, !  (5 tokens; Punkt ends the sentence after the quote)
    # 'twice.'    -> twice, .            (2 tokens)
    # clipped unigram matches: twice, . = 2 of 5 -> P1 = 0.4; hypothesis longer -> BP = 1
    assert bleu1('"Twice."!', "Twice.") == pytest.approx(0.4)
    # without the sentence split "2023." would stay one token and match nothing:
    # '2023. 2024' -> 2023, ., 2024 ; gold '2023' -> 2023 : P1 = 1/3, BP = 1
    assert bleu1("2023. 2024", "2023") == pytest.approx(1 / 3)
    from nltk.tokenize import NLTKWordTokenizer

    assert "2023." in NLTKWordTokenizer().tokenize("2023. 2024")  # the old, unsplit tokens
