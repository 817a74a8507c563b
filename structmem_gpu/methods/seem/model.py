"""Episodic Event Frames in memory: role tuples, cleaning, action splitting, rendering.

docs/methods.md "SEEM: frames" (role tuples, rendering, post-processing). The rendering
is both what a frame's embedding is computed from and what the QA context shows:

    >>> ev = Event(("Lena",), ("Lena signed up for the Riverside Half Marathon",), "2024-05-18",
    ...            None, "first half marathon", None)
    >>> print(render_frame("Lena signed up for a half marathon.", (ev,)))
    Summary: Lena signed up for a half marathon.
    Event 1:
      Participants: Lena
      Action: Lena signed up for the Riverside Half Marathon
      Time: 2024-05-18
      Reason: first half marathon
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SLOTS = ("time", "location", "reason", "method")  # the nullable single-string roles


@dataclass(frozen=True)
class Event:
    participants: tuple[str, ...]
    action: tuple[str, ...]
    time: str | None
    location: str | None
    reason: str | None
    method: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"participants": list(self.participants), "action": list(self.action), "time": self.time,
                "location": self.location, "reason": self.reason, "method": self.method}


@dataclass(frozen=True)
class FrameContent:
    """What a frame says (summary + events), without provenance."""

    summary: str
    events: tuple[Event, ...]


def _text(value: Any) -> str | None:
    """A slot value as a stripped string; None for null, blanks and the model's 'null' strings."""
    if value is None or isinstance(value, bool | dict | list):
        return None
    text = str(value).strip()
    return None if not text or text.lower() in ("null", "none", "n/a", "unknown") else text


def _texts(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    seen: dict[str, None] = {}
    for item in items:
        t = _text(item)
        if t is not None:
            seen.setdefault(t, None)
    return tuple(seen)


def event_from_dict(d: Any) -> Event | None:
    """An event from a reply item; None when it carries no participant and no action."""
    if not isinstance(d, Mapping):
        return None
    ev = Event(_texts(d.get("participants")), _texts(d.get("action")),
               *(_text(d.get(slot)) for slot in SLOTS))
    return ev if ev.participants or ev.action else None


def split_actions(events: Iterable[Event], max_actions: int) -> tuple[Event, ...]:
    """Events with more than `max_actions` actions become several events with the same roles."""
    out: list[Event] = []
    for ev in events:
        if len(ev.action) <= max_actions:
            out.append(ev)
            continue
        for start in range(0, len(ev.action), max_actions):
            out.append(Event(ev.participants, ev.action[start : start + max_actions], ev.time, ev.location,
                             ev.reason, ev.method))
    return tuple(out)


def clean_events(raw: Any, max_actions: int, max_events: int) -> tuple[Event, ...]:
    """Reply events -> valid, deduplicated events, actions split, at most `max_events`."""
    items = raw if isinstance(raw, list) else []
    events = [e for e in (event_from_dict(d) for d in items) if e is not None]
    unique = list(dict.fromkeys(events))
    return split_actions(unique, max_actions)[:max_events]


def content_from_reply(data: Any, max_actions: int, max_events: int) -> FrameContent | None:
    """{summary, events} -> FrameContent; None when the summary is missing or blank."""
    if not isinstance(data, Mapping):
        return None
    summary = _text(data.get("summary"))
    if summary is None:
        return None
    return FrameContent(summary, clean_events(data.get("events"), max_actions, max_events))


def render_frame(summary: str, events: Sequence[Event]) -> str:
    """`Summary:` line, then `Event i:` with one indented line per non-empty slot."""
    lines = [f"Summary: {summary}"]
    for i, ev in enumerate(events, start=1):
        lines.append(f"Event {i}:")
        if ev.participants:
            lines.append(f"  Participants: {', '.join(ev.participants)}")
        if ev.action:
            lines.append(f"  Action: {'; '.join(ev.action)}")
        for slot in SLOTS:
            value = getattr(ev, slot)
            if value:
                lines.append(f"  {slot.capitalize()}: {value}")
    return "\n".join(lines)


def events_from_rows(rows: Sequence[Mapping[str, Any]] | None) -> tuple[Event, ...]:
    """Events back from a Parquet list-of-struct cell."""
    return tuple(e for e in (event_from_dict(r) for r in rows or []) if e is not None)
