"""Shared pieces of the data tests: where the shared data is, and a mark for tests that need it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("ATTENTION_ATLAS_DATA", "/work/shared/data"))
needs_data = pytest.mark.skipif(
    not (SHARED / "ptb-word" / "ptb.valid.txt").exists(),
    reason="the text data is not in $ATTENTION_ATLAS_DATA",
)
