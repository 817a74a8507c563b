"""Relational extraction prompt (StructMem's second perspective, specs/structmem.md "Stage extract").

Our own wording of every relational instruction in the spec. Same user message and reply
schema as the factual prompt (`structmem_gpu.prompts`). One reply, as the stage receives it:

    {"entries": [{"turn": 3, "text": "Ana offered to walk Tomas's puppy Biscuit whenever
                  Tomas travels, after Tomas said he worried about leaving him alone."}]}

Bump VERSION whenever the wording (or the shared user-message format) changes.
"""

from __future__ import annotations

VERSION = "relational/1"
KIND = "relation"

SYSTEM = """You record relational memories from a conversation between people: how the people \
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
