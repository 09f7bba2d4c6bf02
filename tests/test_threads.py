"""attention_atlas.threads.intra_op_threads: set for a block, restored after it, no call when
nothing changes, one-line errors for bad counts."""

from __future__ import annotations

import pytest
import torch

from attention_atlas.threads import intra_op_threads


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every torch.set_num_threads call made (still carried out)."""
    made: list[int] = []
    real = torch.set_num_threads

    def record(n: int) -> None:
        made.append(n)
        real(n)

    monkeypatch.setattr(torch, "set_num_threads", record)
    return made


def test_sets_the_count_for_the_block_and_restores_it(calls: list[int]) -> None:
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with intra_op_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    assert calls == [other, before]


def test_restores_after_an_error_and_after_the_block_changed_the_count(calls: list[int]) -> None:
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with pytest.raises(RuntimeError, match="inside"), intra_op_threads(other):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with intra_op_threads(None):
        torch.set_num_threads(other)
    assert torch.get_num_threads() == before
    assert calls == [other, before, other, before]


def test_makes_no_call_when_the_count_does_not_change(calls: list[int]) -> None:
    before = torch.get_num_threads()
    with intra_op_threads(before):
        assert torch.get_num_threads() == before
    with intra_op_threads(None):
        pass
    assert calls == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_refuses_a_count_that_is_not_a_positive_int(bad: object, calls: list[int]) -> None:
    with pytest.raises(ValueError, match=rf"threads: expected a positive int or None, got {bad!r}"):
        with intra_op_threads(bad):  # type: ignore[arg-type]
            pass
    assert calls == []
