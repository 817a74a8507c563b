"""The segment stage's settings (methods/structmem/segment.py), in a module of their own: the
extract stage's dry run reads `segment.batch_tokens` typed, and segment.py imports extract's
windows, so the settings cannot live beside either stage without an import circle."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from structmem_gpu.config.settings import External, RUN_ROLE, SIZE, Settings


class SegmentSettings(Settings):
    """conf/method/structmem.yaml `segment:` (+ compress.model, the shared model); the block
    is generated from these fields."""

    node: ClassVar[str] = "segment"
    yaml_home: ClassVar[str | None] = "method/structmem.yaml"

    buffer_tokens: SIZE = Field(512, description=(
        "Sensory buffer, model tokens (the reference: the model's 512 positions, "
        "max_position_embeddings)."))
    batch_tokens: SIZE = Field(512, description=(
        "Extraction batch, o200k tokens (the reference's hard-coded 512 in LightMemory.__init__)."))
    layers: tuple[Annotated[int, Field(ge=0)], ...] = Field((8, 9, 10, 11), description=(
        "Attention layers averaged for the inter-sentence signal (the reference: 8-11)."))
    batch_size: Annotated[SIZE, RUN_ROLE] = Field(32, description=(
        "Buffers per attention forward pass (speed/memory only)."))
    # The compression model, shared as in the reference (precomp_topic_shared: true).
    model: Annotated[str, External("compress.model")] = "microsoft/llmlingua-2-bert-base-multilingual-cased-meetingbank"
    device: Annotated[Literal["auto", "cuda", "cpu"], RUN_ROLE, External("compress.device")] = "auto"
