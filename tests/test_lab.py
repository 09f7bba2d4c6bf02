"""The SMOKE switch for JupyterLab (apply_smoke) and the lab command line: interactive kernels
started with ATTENTION_ATLAS_SMOKE=1 take the SMOKE values; headless (papermill) runs never do;
the servers listen on 127.0.0.1 with a token."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from attention_atlas.notebooks import HEADLESS_ENV, ParameterError, chapter_smoke, lab


@pytest.fixture
def interactive_smoke(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lab.SMOKE_ENV, "1")
    monkeypatch.delenv(HEADLESS_ENV, raising=False)


def test_the_switch_replaces_the_parameters_by_the_smoke_values(interactive_smoke) -> None:
    namespace = {"steps": 400, "lr": 1e-3, "seeds": [0, 1, 2]}
    lab.apply_smoke({"steps": 5, "lr": 1, "seeds": [0]}, namespace)
    assert namespace == {"steps": 5, "lr": 1.0, "seeds": [0]}
    assert isinstance(namespace["lr"], float)


def test_headless_runs_and_unset_switch_keep_the_book_values(
    interactive_smoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = {"steps": 400}
    monkeypatch.setenv(HEADLESS_ENV, "1")  # papermill, make book, the tests
    lab.apply_smoke({"steps": 5}, namespace)
    assert namespace == {"steps": 400}
    monkeypatch.delenv(HEADLESS_ENV)
    monkeypatch.setenv(lab.SMOKE_ENV, "0")
    lab.apply_smoke({"steps": 5}, namespace)
    assert namespace == {"steps": 400}


def test_the_switch_rejects_unknown_names_and_wrong_types(interactive_smoke) -> None:
    with pytest.raises(ParameterError, match=r"SMOKE sets \['stepz'\]"):
        lab.apply_smoke({"stepz": 5}, {"steps": 400})
    with pytest.raises(ParameterError, match="'steps' in SMOKE expects int"):
        lab.apply_smoke({"steps": "five"}, {"steps": 400})


def test_the_smoke_cell_may_end_with_the_switch(tmp_path: Path) -> None:
    path = tmp_path / "ch.py"
    path.write_text(
        textwrap.dedent(
            """\
            # %% tags=["parameters"]
            n = 10

            # %% tags=["smoke"]
            SMOKE = {"n": 2}
            from attention_atlas.notebooks.lab import apply_smoke  # JupyterLab switch

            apply_smoke(SMOKE, globals())
            """
        )
    )
    assert chapter_smoke(path) == {"n": 2}
    path.write_text(path.read_text().replace("apply_smoke(SMOKE, globals())", "print(SMOKE)"))
    with pytest.raises(ParameterError, match="expected `name = literal`"):
        chapter_smoke(path)


def test_the_lab_command_listens_on_loopback_on_one_port_and_its_token_is_in_the_env() -> None:
    cmd = lab.lab_command(port=9123, root=Path("/r"), allow_origin="http://x")
    assert "--ServerApp.ip=127.0.0.1" in cmd and not any("token" in a.lower() for a in cmd)
    env = lab.kernel_environment(smoke=False, token="abc")
    assert env["JUPYTER_TOKEN"] == "abc" and lab.TOKEN_ENV not in env
    assert "--ServerApp.port=9123" in cmd and "--ServerApp.port_retries=0" in cmd
    assert "--ServerApp.allow_origin=http://x" in cmd
