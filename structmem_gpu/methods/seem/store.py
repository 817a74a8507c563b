"""One conversation's frame store during fusion: frames, their vectors, Phi, merges.

docs/methods.md "SEEM: fusion". Frames are kept in insertion order (ties in the top-1 search go
to the earlier frame, so the result does not depend on how conversations are scheduled). A frame
is founded by one passage and named after it, `frame:<pid>`; a passage belongs to exactly one
frame at every moment. Example:

    store = ConversationStore.create("sample-1", passages, eef0, vectors)
    store.insert(0)                     # frame:sample-1:D1:1 <- EEF_0 of passage 0
    j, sim = store.top1(store.initial_vectors[1])
    store.merge(j, [1], fused_content, {"step": 1, ...})   # provenance = union, chronological
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from structmem_gpu.methods.seem.model import FrameContent, render_frame
from structmem_gpu.methods.seem.passages import Passage


@dataclass(frozen=True)
class FrameState:
    frame_id: str
    content: FrameContent
    provenance: tuple[int, ...]  # passage positions, ascending (= chronological)
    n_merges: int = 0
    history: tuple[Mapping[str, Any], ...] = ()

    @property
    def rendering(self) -> str:
        return render_frame(self.content.summary, self.content.events)


@dataclass
class ConversationStore:
    conv_id: str
    passages: list[Passage]  # chronological
    initial: list[FrameContent]  # EEF_0 of each passage, aligned with `passages`
    initial_vectors: np.ndarray  # (n, d) unit vectors of the EEF_0 renderings
    frames: list[FrameState] = field(default_factory=list)
    # Row i = vector of frames[i]; preallocated (a conversation never has more frames than
    # passages) so the top-1 search is one matmul per step, without re-stacking vectors.
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    frame_of: dict[int, int] = field(default_factory=dict)  # passage position -> frame index

    @classmethod
    def create(cls, conv_id: str, passages: Sequence[Passage], initial: Sequence[FrameContent],
               initial_vectors: np.ndarray) -> ConversationStore:
        if not (len(passages) == len(initial) == initial_vectors.shape[0]):
            raise ValueError(f"{conv_id}: {len(passages)} passages, {len(initial)} frames, "
                             f"{initial_vectors.shape[0]} vectors")
        matrix = np.zeros_like(initial_vectors, dtype=np.float32)
        return cls(conv_id, list(passages), list(initial), initial_vectors, matrix=matrix)

    def __len__(self) -> int:
        return len(self.passages)

    def top1(self, vector: np.ndarray) -> tuple[int, float] | None:
        """(index, cosine) of the most similar frame; None when the store is empty."""
        n = len(self.frames)
        if n == 0:
            return None
        sims = self.matrix[:n] @ vector
        j = int(np.argmax(sims))  # first maximum: the earliest frame wins ties
        return j, float(sims[j])

    def insert(self, position: int) -> int:
        """A new frame from the passage's EEF_0; returns its index."""
        frame = FrameState(f"frame:{self.passages[position].pid}", self.initial[position], (position,))
        return self._append(frame, self.initial_vectors[position])

    def found_group(self, positions: Sequence[int], content: FrameContent, history: Mapping[str, Any]) -> int:
        """A new frame founded by several new passages at once (windowed fusion)."""
        first = min(positions)
        frame = FrameState(f"frame:{self.passages[first].pid}", content, tuple(sorted(positions)),
                           len(positions) - 1, (dict(history),))
        return self._append(frame, self.initial_vectors[first])  # re-embedded by the caller

    def _append(self, frame: FrameState, vector: np.ndarray) -> int:
        self.frames.append(frame)
        idx = len(self.frames) - 1
        self.matrix[idx] = vector
        for p in frame.provenance:
            self.frame_of[p] = idx
        return idx

    def room(self, index: int, cap: int) -> int:
        """How many more passages frame `index` may absorb under the provenance cap."""
        return max(0, cap - len(self.frames[index].provenance))

    def merge(self, index: int, positions: Sequence[int], content: FrameContent,
              history: Mapping[str, Any]) -> None:
        """Update frame `index` in place: new content, provenance = union (chronological)."""
        old = self.frames[index]
        prov = tuple(sorted(set(old.provenance) | set(positions)))
        self.frames[index] = replace(old, content=content, provenance=prov,
                                     n_merges=old.n_merges + len(prov) - len(old.provenance),
                                     history=(*old.history, dict(history)))
        for p in positions:
            self.frame_of[p] = index

    def set_vector(self, index: int, vector: np.ndarray) -> None:
        self.matrix[index] = vector

    def pids(self, frame: FrameState) -> list[str]:
        return [self.passages[p].pid for p in frame.provenance]
