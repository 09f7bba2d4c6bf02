"""Data: Penn Treebank (character and word level), WikiText-2, digits as patch tokens, and
small synthetic tasks.

Data sets come in two shapes:

* :class:`TextCorpus`: three 1-D token streams (train/valid/test) and a :class:`Vocab`,
  sampled as random contiguous windows (:class:`WindowSampler`) and evaluated with
  :func:`eval_windows`;
* :class:`ArrayTask`: fixed ``(x, y)`` arrays for train and validation (digits patches, the
  synthetic tasks), sampled by :class:`RowSampler`.

Modules: :mod:`.files` (the data folder, sha256 checks, downloads), :mod:`.corpora` (Vocab,
TextCorpus, PTB and WikiText-2 loaders), :mod:`.tasks` (ArrayTask, digits, copy, recall,
subsets, :func:`load_task`), :mod:`.mqar` (multi-query associative recall), :mod:`.samplers` (training samplers, evaluation windows).
"""

from __future__ import annotations

from .catalog import TASKS, check_task, load_task, task_options
from .corpora import TextCorpus, Vocab, load_char_ptb, load_wikitext2, load_word_ptb
from .files import ENV_VAR, FILES, DataFileError, FileSpec, char_ptb_from_word, data_dir, data_file
from .mqar import mqar_task
from .samplers import RowSampler, WindowSampler, eval_windows, make_sampler
from .tasks import (
    IGNORE_INDEX,
    ArrayTask,
    associative_recall_task,
    copy_task,
    load_digits_patches,
    subset,
)

__all__ = [
    "ENV_VAR",
    "FILES",
    "IGNORE_INDEX",
    "TASKS",
    "ArrayTask",
    "DataFileError",
    "FileSpec",
    "RowSampler",
    "TextCorpus",
    "Vocab",
    "WindowSampler",
    "associative_recall_task",
    "char_ptb_from_word",
    "check_task",
    "copy_task",
    "data_dir",
    "data_file",
    "eval_windows",
    "load_char_ptb",
    "load_digits_patches",
    "load_task",
    "load_wikitext2",
    "load_word_ptb",
    "make_sampler",
    "mqar_task",
    "subset",
    "task_options",
]
