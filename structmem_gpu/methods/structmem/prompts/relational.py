"""Relational extraction prompt (StructMem's second perspective,
docs/methods.md "StructMem: extraction").

Two variants (`extract.prompt_variant`):
- `default`: our own wording of every instruction of the reference relational prompt
  (the reference relational prompt): relational and emotional dynamics (evaluative, supportive,
  emotional, engagement, agreement, responsive behaviour), plain facts skipped unless shared in
  response, enough context, time when relevant, one merged statement per message, "both" for
  mutual agreement at the turn that completes it; with our worked example (thirteen messages,
  seven relations).
- `grounded`: our earlier wording (relational/1): adds co-participation, causes and sequence,
  computed dates, no guessed motives.

Same user message and reply schema as the factual prompt (`structmem_gpu.prompts`). One reply,
as the stage receives it:

    {"entries": [{"turn": 2, "text": "Sam congratulated Dana on her promotion to team lead and
                  praised the hard work behind it."}]}

Bump VERSION whenever the wording (or the shared user-message format) changes.
"""

from __future__ import annotations

from structmem_gpu.prompts.variants import variant_system, variant_version

VERSION = "relational/3"  # 3: time "when relevant", said naturally (no date anchoring)
GROUNDED_VERSION = "relational/2"  # base of the grounded variant, whose text is unchanged
KIND = "relation"

# The worked example (ours): 13 messages, 7 relations; turn 1 shares a photo, turn 10 is a plain
# fact (skipped), turn 7 completes a mutual agreement ("both"), turn 12 responds in kind, and
# turns 3 and 9 carry relative times as said (the reference adds time naturally, no dates).
EXAMPLE = """Example. The user message:
Session date: 2023-09-14 20:10 (Thursday)

Turns:
[1] Dana: I got the promotion! Team lead starting Monday. [image: Dana holding a signed offer letter in front of her office building]
[2] Sam: Dana, that's huge, congratulations! You've worked so hard for this.
[3] Dana: Thanks, Sam. Honestly, your pep talk last month helped a lot.
[4] Sam: Happy to help. What's the first thing you'll change?
[5] Dana: Shorter meetings, for sure.
[6] Sam: Good call, long meetings drain everyone.
[7] Dana: Exactly, I've always felt that way too.
[8] Sam: I'm nervous about my own job interview next week, though.
[9] Dana: You'll do great. You prepare better than anyone I know.
[10] Sam: It's at a design studio downtown.
[11] Dana: Want to do a mock interview on Saturday?
[12] Sam: Yes please! I'll bring coffee, my turn to help for once.
[13] Dana: Deal. And I'm proud of you for applying at all.

A good reply:
{"entries": [
 {"turn": 2, "text": "Sam congratulated Dana on her promotion to team lead, shared in her photo with the signed offer letter, and praised the hard work behind it."},
 {"turn": 3, "text": "Dana thanked Sam and credited Sam's pep talk last month with helping her get the promotion."},
 {"turn": 4, "text": "Sam showed interest in Dana's new role by asking what she would change first."},
 {"turn": 7, "text": "Dana and Sam both agree that long meetings drain everyone."},
 {"turn": 9, "text": "Dana encouraged Sam about the job interview next week and voiced confidence in Sam's preparation."},
 {"turn": 12, "text": "Sam eagerly accepted Dana's offer of a mock interview on Saturday and offered to bring coffee in return for her help."},
 {"turn": 13, "text": "Dana told Sam she was proud of Sam for applying for the job."}
]}
Turns 1, 5, 8 and 10 only report facts and give no relation; turn 7 completes the agreement \
begun in turn 6."""

_INSTRUCTIONS = (
    """You extract relational memories: how the people in a conversation relate to each other, \
not what they said. Another system already extracts the facts, so focus on the relational and \
emotional dynamics between the speakers.

The user message gives the session date and the turns to read, numbered "[n] Speaker: text". \
Lines starting with "(context)" come earlier in the same session: use them to understand the \
numbered turns, but extract nothing from them. A turn ending with "[image: ...]" shared a photo \
that the brackets describe.

Look for these kinds of behaviour:
- evaluative: praising, acknowledging, appreciating what the other did or made;
- supportive: encouraging, reassuring, voicing confidence in the other;
- emotional: gratitude, pride, excitement, congratulations, sympathy;
- engagement: asking questions, showing interest, following up;
- agreement: shared values, views or tastes;
- responsive: sharing something in reply to the other, returning a favour or an offer.

Skip statements that only report a fact. Keep a piece of sharing when it is done in response \
to the other person (it is then a responsive behaviour).

Each relation:
- gives enough context to be understood alone: who did it towards whom, and exactly what was \
praised, asked about or agreed on;
- carries time information when it matters, in the words of the conversation ("Ben \
cheered Ana on before her exam next week"); an exchange with no time to it needs no date;
- merges related behaviours within one turn into one statement;
- for a mutual agreement, says "both" ("X and Y both ...") and belongs to the turn where \
the agreement is completed.

Reply with JSON only: an object whose "entries" list holds one object per relation, with \
"turn" (the number of the turn the relation comes from) and "text" (the relation).

"""
)
SYSTEM = _INSTRUCTIONS + EXAMPLE
SYSTEM_NO_EXAMPLE = _INSTRUCTIONS.rstrip()

# relational/1 wording, kept as the `grounded` variant.
SYSTEM_GROUNDED = """You record relational memories from a conversation between people: how the people \
relate to each other and how the events they talk about connect. Another pass records the \
plain facts, so leave out statements that only report a fact.

The user message gives the session date and the turns to read, numbered "[n] Speaker: text". \
Lines starting with "(context)" come earlier in the same session: use them to understand the \
numbered turns, but take nothing from them. A turn ending with "[image: ...]" shared a photo \
that the brackets describe.

Look for:
- reactions to the other person: support and encouragement, praise, thanks, congratulations, \
pride, excitement, sympathy, worry, and other feelings;
- interest: questions, asking for details, following up on something told before;
- agreement or disagreement, shared values, shared tastes;
- co-participation: who did, does or will do something together with whom;
- causes and consequences: why someone did something, what it led to;
- sequence: what followed what, a plan that was carried out, a promise kept;
- change over time: a view, habit, plan or relationship that changed, and how.
Telling something in reply to the other person counts when the reply is the point, e.g. \
"Ben told Ana about his own move after Ana mentioned hers".

Each statement:
- names both sides ("Melanie praised Caroline's sunset painting") and says exactly what the \
reaction or link is about;
- gives the time when it matters: a relative time becomes a date computed from the session \
date, and the original words are kept too;
- stands on its own, never "he", "she", "I" or "you" without the name;
- merges several reactions of one turn into one statement; when both people agree, write \
"both ..." and give the turn where the agreement is completed;
- says only what the turns show. Invent nothing and do not guess motives.

Reply with JSON only: an object whose "entries" list holds one object per statement, with \
"turn" (the number of the turn the statement comes from) and "text" (the statement)."""


def system(variant: str, example: bool = True) -> str:
    """The system prompt of an extraction variant ("default" | "grounded")."""
    return variant_system(variant, example, default=SYSTEM, no_example=SYSTEM_NO_EXAMPLE,
                          grounded=SYSTEM_GROUNDED)


def version(variant: str, example: bool = True) -> str:
    """'relational/3', 'relational/2+grounded' or 'relational/3+noexample'."""
    return variant_version(GROUNDED_VERSION if variant == "grounded" else VERSION, variant, example)
