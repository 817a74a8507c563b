"""Contracts from docs/design.md that several test modules check, written out literally
(not imported from the package) so that a change in the code cannot move the goalposts."""

# Keys of every group in report.json (`overall` and each `by_category` entry).
REPORT_GROUP_KEYS = frozenset(
    {
        "name",
        "n",
        "judge_accuracy",
        "judge_accuracy_ci95",
        # docs/evaluation.md "Judge protocols": judge_accuracy counts unjudged replies as wrong;
        # the judged-only accuracy and the unjudged count stand beside it.
        "judge_accuracy_judged",
        "unjudged",
        # docs/evaluation.md "Intervals": every interval names its resampling unit; the cluster
        # interval over conversations, their count, and the minimum detectable difference.
        "judge_accuracy_ci95_unit",
        "judge_accuracy_ci95_conversations",
        "conversations",
        "mde_paired",
        "f1_locomo",
        "f1_mem0",
        "bleu1",
        "evidence_recall",
    }
)
