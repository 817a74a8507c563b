"""The part of StructMem that the fidelity audits (audit_extraction.py,
audit_consolidation.py) may use: a small, stable interface, so that the audit stages
depend on these names only and not on the build stages' internals.

    from structmem_gpu.methods.structmem.audit_api import plan_windows, plan_conversation

- extraction: `ExtractionWindow`, `ExtractSettings` and `plan_from_settings` (the exact
  windows the extract stage sends for a config, token-packed or fixed), `plan_windows`;
- consolidation: `ConsolidateSettings`, `WindowPlan`, `conversation_views` and
  `plan_conversation` (the windows, buffers and seed events the consolidate stage uses);
  for the dry run, `stand_in_windows`, `stand_in_synthesis` and `SYNTHESIS_COMPLETION`
  (consolidate's own estimate of its windows and of a synthesis' length).

A change in the build stages that keeps these names and meanings needs no audit change.
"""

from __future__ import annotations

from structmem_gpu.methods.structmem.consolidate import (
    SYNTHESIS_COMPLETION,
    ConsolidateSettings,
    WindowPlan,
    conversation_views,
    plan_conversation,
    stand_in_synthesis,
    stand_in_windows,
)
from structmem_gpu.methods.structmem.extract import ExtractSettings, plan_from_settings
from structmem_gpu.methods.structmem.extraction_windows import ExtractionWindow, plan_windows

__all__ = [
    "SYNTHESIS_COMPLETION",
    "ConsolidateSettings",
    "ExtractSettings",
    "ExtractionWindow",
    "WindowPlan",
    "conversation_views",
    "plan_conversation",
    "plan_from_settings",
    "plan_windows",
    "stand_in_synthesis",
    "stand_in_windows",
]
