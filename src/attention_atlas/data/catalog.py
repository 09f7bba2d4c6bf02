"""Every task by name (the command line's ``--task``): :data:`TASKS`, the options each takes,
and :func:`load_task`."""

from __future__ import annotations

import os
from typing import Any

from attention_atlas.validate import ConfigError, close_matches

from .corpora import load_char_ptb, load_wikitext2, load_word_ptb
from .mqar import mqar_task
from .tasks import associative_recall_task, copy_task, load_digits_patches

__all__ = ["GENERATED", "TASKS", "check_task", "load_task", "task_options"]

TASKS = (
    "ptb-char", "ptb-word", "wikitext2", "wikitext2-char", "digits", "copy", "recall", "mqar",
)  # fmt: skip
#: the tasks generated in memory (no data folder)
GENERATED = ("digits", "copy", "recall", "mqar")


def _loaders() -> dict[str, tuple[Any, dict[str, Any]]]:
    """Task name -> (loader, fixed options); "root" loaders read text files from the data folder."""
    return {
        "ptb-char": (load_char_ptb, {}),
        "ptb-word": (load_word_ptb, {}),
        "wikitext2": (load_wikitext2, {"mode": "word"}),
        "wikitext2-char": (load_wikitext2, {"mode": "char"}),
        "digits": (load_digits_patches, {}),
        "copy": (copy_task, {}),
        "recall": (associative_recall_task, {}),
        "mqar": (mqar_task, {}),
    }


def task_options(name: str) -> list[str]:
    """The options task ``name`` takes (``task.NAME=VALUE`` on the command line)."""
    import inspect

    check_task(name)
    fn, fixed = _loaders()[name]
    params = inspect.signature(fn).parameters
    return [n for n in params if n not in ("root", "dtype", *fixed)]


def check_task(name: str, options: dict[str, Any] | None = None) -> None:
    """Task ``name`` exists and takes every option in ``options`` (their values are checked
    by the loader); else :class:`ConfigError` naming the known ones."""
    if name not in TASKS:
        raise ConfigError(
            f"unknown task {name!r}{close_matches(name, TASKS)}; known: {', '.join(TASKS)}"
        )
    takes = task_options(name) if options else []
    for opt in options or {}:
        if opt not in takes:
            raise ConfigError(
                f"task {name!r} does not take option {opt!r}{close_matches(opt, takes)}; "
                f"it takes: {', '.join(takes) or '(none)'}"
            )


def load_task(name: str, root: str | os.PathLike[str] | None = None, **options: Any) -> Any:
    """A data set by task name (the command line's ``--task``): one of :data:`TASKS`."""
    check_task(name, options)
    fn, fixed = _loaders()[name]
    if name in GENERATED:
        return fn(**fixed, **options)
    return fn(root, **fixed, **options)
