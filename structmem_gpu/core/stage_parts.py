"""What a stage's work is for (`Stage.part`), recorded per stage in the manifest (`part`):

- input: loads the benchmark (no cost table counts it);
- build: builds the memory (cost per turn, compared with a paper's build cost);
- question: retrieves, answers or judges per question (cost per question);
- audit: checks fidelity (a cost of its own, never part of the build curve);
- report: summarises the run.

Here, below every reader, so that the analysis side reads a finished run's parts from its
manifest without importing a stage.
"""

INPUT, BUILD, QUESTION, AUDIT, REPORT = "input", "build", "question", "audit", "report"
PARTS = (INPUT, BUILD, QUESTION, AUDIT, REPORT)
