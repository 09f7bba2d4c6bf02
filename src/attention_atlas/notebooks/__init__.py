"""Run the book's chapters headlessly with papermill, with book or smoke parameters.

A chapter is a jupytext ``py:percent`` file ``notebooks/NN_name.py``. It declares its book
parameters in the cell tagged ``parameters`` (one ``name = literal`` per line) and its small
test values in the cell tagged ``smoke`` (``SMOKE = {"name": literal, ...}``)::

    # %% tags=["parameters"]
    n_steps = 400
    seeds = [0, 1, 2]

    # %% tags=["smoke"]
    SMOKE = {"n_steps": 5, "seeds": [0]}

:func:`run_chapter` reads the chapter with :func:`jupytext.read`, checks every injected value
against the parameter it overrides (unknown name or wrong type: :class:`ParameterError`,
before anything runs), executes it with :func:`papermill.execute_notebook` and writes the
executed ``.ipynb``. A failed cell (a failing ``assert``) raises :class:`ChapterFailed`, whose
message names the chapter, the cell and the error.

Command line: ``python -m attention_atlas notebooks run [--smoke] [NAME ...] [--out DIR]
[-p key=value ...]`` (see :mod:`attention_atlas.cli.notebooks`).

Modules: :mod:`.chapters` (where chapters are, their parameters and SMOKE values, checking
overrides), :mod:`.runner` (executing chapters), :mod:`.lab` (JupyterLab and the live book).
"""

from __future__ import annotations

from .chapters import (
    ParameterError,
    chapter_parameters,
    chapter_smoke,
    chapters,
    notebooks_dir,
    parse_override,
    repo_root,
    resolve_chapter,
    validate_parameters,
)
from .runner import (
    HEADLESS_ENV,
    ChapterFailed,
    ChapterResult,
    output_path,
    run_chapter,
    run_chapters,
)

__all__ = [
    "HEADLESS_ENV",
    "ChapterFailed",
    "ChapterResult",
    "ParameterError",
    "chapter_parameters",
    "chapter_smoke",
    "chapters",
    "notebooks_dir",
    "output_path",
    "parse_override",
    "repo_root",
    "resolve_chapter",
    "run_chapter",
    "run_chapters",
    "validate_parameters",
]
