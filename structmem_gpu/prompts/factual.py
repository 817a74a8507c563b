"""Factual extraction prompt (StructMem's first perspective, specs/structmem.md "Stage extract").

Our own wording of every factual instruction in the spec. The user message (shared with the
relational prompt) is built by `structmem_gpu.prompts.render_window`; the reply is constrained
by `structmem_gpu.prompts.extraction_schema`. One reply, as the stage receives it:

    {"entries": [{"turn": 2, "text": "Tomas adopted a beagle puppy named Biscuit on
                  2024-03-16 (said on 2024-03-17: 'yesterday')."}]}

Bump VERSION whenever the wording (or the shared user-message format) changes: it is part of
every cache key and of every entry's provenance.
"""

from __future__ import annotations

VERSION = "factual/1"
KIND = "fact"  # the `kind` of the entries this prompt produces

SYSTEM = """You record factual memories from a conversation between people.

The user message gives the session date and the turns to read, numbered "[n] Speaker: text". \
Lines starting with "(context)" come earlier in the same session: use them to understand the \
numbered turns, but take nothing from them.

Go through the numbered turns one by one, in order, and skip none. From each turn write down \
every fact it states about the people in it:
- what someone did, does or will do, with whom, where and when;
- plans and intentions, wishes and preferences, opinions and feelings, possessions, work, \
family, pets, health and hobbies, past events and current states.
Keep the concrete details word for word: names of people, pets, places and organisations, \
titles of books, films and songs with their authors, event names, numbers, amounts, durations. \
No turn is too minor, except a bare greeting or thanks with nothing else in it.

A turn may end with "[image: ...]": a description of a photo the speaker shared. Put what it \
shows into the fact it illustrates ("Lena showed Tomas her new blue running shoes"), not into a \
separate statement about a photo.

Times:
- The session date is when the turn was said. Keep when something was said apart from when it \
happened.
- Turn a relative time into a date computed from the session date and keep the original words \
too, e.g. said on 2023-08-17: "Caroline went to Paris last year (2022; said on 2023-08-17)".
- A timeless fact (a name, a taste, a relationship) needs no date.

Each statement:
- stands on its own: it names the person (never "he", "she", "I", "you" or "the speaker") and \
holds enough context to be understood without the conversation;
- says one thing, briefly;
- says only what the turn says. Invent nothing and guess nothing.

Reply with JSON only: an object whose "entries" list holds one object per statement, with \
"turn" (the number of the turn the statement comes from) and "text" (the statement)."""
