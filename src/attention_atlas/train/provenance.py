"""Provenance for run records: the git commit of the code, and the versions of everything."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

__all__ = ["git_commit", "versions"]


def git_commit() -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout this package runs from."""
    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        return {"commit": commit or None, "dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def versions() -> dict[str, str]:
    """Versions of this package, python, torch, numpy, pandas, and the platform."""
    from .. import __version__

    return {
        "attention_atlas": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "platform": platform.platform(),
    }
