"""Factual extraction prompt (StructMem's first perspective,
docs/methods.md "StructMem: extraction").

Two variants (`extract.prompt_variant`):
- `default`: our own wording of every instruction of the reference factual prompt
  (the reference factual prompt): every message in order, every specific detail, clearly
  supported inferred insights as *extra* entries, relative times kept as said and anchored to
  the message date ("next month after 2024-01-07"), and a worked example of the same shape
  (two topics, ten messages, ten facts, one inferred, one relative time, one image).
- `grounded`: our stricter wording (factual/1): computed absolute dates, no inference.

The user message (shared with the relational prompt) is built by
`structmem_gpu.prompts.render_window`; the reply is constrained by
`structmem_gpu.prompts.extraction_schema`. One reply, as the stage receives it:

    {"entries": [{"turn": 5, "text": "Priya plans to travel to Lisbon with her sister Anika
                  next month after 2024-01-07."}]}

Bump VERSION whenever the wording (or the shared user-message format) changes: it is part of
every cache key and of every entry's provenance.
"""

from __future__ import annotations

from structmem_gpu.prompts.variants import variant_system, variant_version

VERSION = "factual/2"
KIND = "fact"  # the `kind` of the entries this prompt produces

# The worked example (ours): 2 topics, 10 messages, 10 facts; turn 3 carries one inferred
# insight beside its specific facts, turn 5 one relative time, turn 7 one image description.
EXAMPLE = """Example. The user message:
Session date: 2024-01-07 18:30 (Sunday)

Turns:
[1] Priya: Hey Marco! I finally finished "The Left Hand of Darkness" by Ursula K. Le Guin last night.
[2] Marco: Nice! Did you like it?
[3] Priya: Loved it. That's my third Le Guin novel this winter, she might be my favourite author now.
[4] Marco: I'm reading "Project Hail Mary" by Andy Weir for my book club at the Eastside Library.
[5] Priya: Totally unrelated, but my sister Anika and I are going to Lisbon next month!
[6] Marco: Lisbon! For how long?
[7] Priya: Ten days. We booked a flat in Alfama. [image: a booking page showing a yellow-tiled building on a narrow cobbled street]
[8] Marco: Looks lovely. I was in Porto in 2019 for a conference of the European Cartographic Society.
[9] Priya: I didn't know you made maps!
[10] Marco: Just a hobby. I've been drawing maps for 6 years.

A good reply:
{"entries": [
 {"turn": 1, "text": "Priya finished reading \\"The Left Hand of Darkness\\" by Ursula K. Le Guin last night before 2024-01-07."},
 {"turn": 3, "text": "Priya loved \\"The Left Hand of Darkness\\" by Ursula K. Le Guin."},
 {"turn": 3, "text": "\\"The Left Hand of Darkness\\" is the third Ursula K. Le Guin novel Priya read this winter (said on 2024-01-07)."},
 {"turn": 3, "text": "Priya considers Ursula K. Le Guin possibly her favourite author."},
 {"turn": 3, "text": "Priya is an avid reader of science fiction (inferred from reading three Le Guin novels in one winter)."},
 {"turn": 4, "text": "Marco is reading \\"Project Hail Mary\\" by Andy Weir for his book club at the Eastside Library."},
 {"turn": 5, "text": "Priya plans to travel to Lisbon with her sister Anika next month after 2024-01-07."},
 {"turn": 7, "text": "Priya and her sister Anika booked a flat in Alfama, Lisbon, for their ten-day trip: a yellow-tiled building on a narrow cobbled street."},
 {"turn": 8, "text": "Marco was in Porto in 2019 for a conference of the European Cartographic Society."},
 {"turn": 10, "text": "Marco has been drawing maps as a hobby for 6 years (said on 2024-01-07)."}
]}
Turns 2, 6 and 9 only ask questions, so they give no fact."""

_CLOSING = """

Be exhaustive: every turn, every detail, nothing skipped as minor."""

_INSTRUCTIONS = (
    """You extract personal information: every fact about the people in a conversation.

The user message gives the session date and the turns to read, numbered "[n] Speaker: text" \
(one turn = one message; consecutive turns often move from one topic to another). Lines \
starting with "(context)" come earlier in the same session: use them to understand the numbered \
turns, but extract nothing from them.

A turn may end with "[image: ...]", a description of a photo the speaker shared. Fold what it \
shows into the facts you take from the turn's text; never write a separate fact about the image.

Work through the numbered turns strictly in ascending order, one by one, and skip none: no \
turn is too minor. Take from each turn everything it says about the speakers: past events and \
current states, plans and intentions, opinions and attitudes, wishes and preferences.

Keep every specific detail exactly: full titles of books, films, songs and artworks together \
with their authors, full names of places, names of events, details of items (kind, colour, \
brand), numbers, amounts and durations, relative times, names of organisations.

Beside the specific facts you may add an inferred insight (a broader trait, interest or \
pattern) when the conversation clearly supports it. Write it as an extra entry; never let it \
replace the specific facts it comes from.

Complete each fact lightly so that it stands on its own: name the person (never "he", "she", \
"I" or "you"), and add the little context needed to understand it without the conversation.

Times: keep when something was said apart from when it happened. The session date is when a \
turn was said. Keep a relative time exactly as said and anchor it to the session date in \
YYYY-MM-DD form, e.g. "next month after 2024-01-07" or "last night before 2024-01-07"; do not \
work out a new date. A timeless fact (a name, a taste, a relationship) gets no date.

Reply with JSON only: an object whose "entries" list holds one object per fact, with "turn" \
(the number of the turn the fact comes from) and "text" (the fact).

"""
)
SYSTEM = _INSTRUCTIONS + EXAMPLE + _CLOSING
SYSTEM_NO_EXAMPLE = _INSTRUCTIONS.rstrip() + _CLOSING

# factual/1 wording, kept as the `grounded` variant (computed dates, no inference).
SYSTEM_GROUNDED = """You record factual memories from a conversation between people.

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


def system(variant: str, example: bool = True) -> str:
    """The system prompt of an extraction variant ("default" | "grounded")."""
    return variant_system(variant, example, default=SYSTEM, no_example=SYSTEM_NO_EXAMPLE,
                          grounded=SYSTEM_GROUNDED)


def version(variant: str, example: bool = True) -> str:
    """'factual/2', 'factual/2+grounded' or 'factual/2+noexample' (recorded on requests)."""
    return variant_version(VERSION, variant, example)
