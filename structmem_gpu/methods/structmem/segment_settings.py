"""The segment stage's settings (methods/structmem/segment.py), in a module of their own: the
extract stage's dry run reads `segment.batch_tokens` typed, and segment.py imports extract's
windows, so the settings cannot live beside either stage without an import circle."""

from __future__ import annotations

from typing import ClassVar

from structmem_gpu.config.settings import SIZE, STR, Enum, Int, List, Settings, knob


class SegmentSettings(Settings):
    """conf/method/structmem.yaml `segment:` (+ compress.model, the shared model); the block
    is generated from these fields."""

    node: ClassVar[str] = "segment"
    yaml_home: ClassVar[str | None] = "method/structmem.yaml"

    buffer_tokens: int = knob(SIZE, 512, description=(
        "Sensory buffer, model tokens (the reference: the model's 512 positions, "
        "max_position_embeddings)."))
    batch_tokens: int = knob(SIZE, 512, description=(
        "Extraction batch, o200k tokens (the reference's hard-coded 512 in LightMemory.__init__)."))
    layers: tuple[int, ...] = knob(List(Int(ge=0)), (8, 9, 10, 11), description=(
        "Attention layers averaged for the inter-sentence signal (the reference: 8-11)."))
    batch_size: int = knob(SIZE, 32, hashed=False, description=(
        "Buffers per attention forward pass (speed/memory only)."))
    # The compression model, shared as in the reference (precomp_topic_shared: true).
    model: str = knob(STR, "microsoft/llmlingua-2-bert-base-multilingual-cased-meetingbank",
                      external="compress.model")
    device: str = knob(Enum("auto", "cuda", "cpu"), "auto", hashed=False, external="compress.device")
