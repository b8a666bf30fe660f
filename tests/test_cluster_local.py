"""``cluster up``'s small truths without starting anything (issue 25, item 3): which
directories it may start in, and the ``--dir`` its hints carry."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cluster import local


@pytest.fixture(autouse=True)
def english(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")


def test_a_hint_names_the_dir_unless_it_is_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert local.dir_args(tmp_path / ".flower" / "cluster") == ""
    assert local.dir_args(tmp_path / "c") == f" --dir {tmp_path / 'c'}"
    assert local.dir_args(tmp_path / "a b") == f" --dir '{tmp_path / 'a b'}'"


def test_a_directory_holding_only_what_a_failed_up_kept_is_still_the_cluster_s(
    tmp_path: Path,
) -> None:
    d = tmp_path / "c"
    d.mkdir()
    assert local._only_ours(d)
    (d / "worker-1.log").write_text("ImportError\n")
    (d / "postgres").mkdir()
    (d / "postgres" / "server.log").write_text("FATAL\n")
    (d / "postgres" / "commands.out").write_text("")
    (d / "temporal").mkdir()
    (d / "temporal" / "server.log").write_text("Error\n")
    assert local._only_ours(d)
    (d / "postgres" / "data").mkdir()  # a server's data is not a log: not ours to start over
    assert not local._only_ours(d)


@pytest.mark.parametrize("name", ["notes.txt", "worker-x.log", "flower"])
def test_anything_else_is_someone_s(tmp_path: Path, name: str) -> None:
    d = tmp_path / "c"
    d.mkdir()
    (d / name).write_text("mine")
    assert not local._only_ours(d)


def test_down_with_nothing_up_raises_nothing_up(tmp_path: Path) -> None:
    with pytest.raises(local.NothingUp) as err:
        local.down(tmp_path / "none", print)
    assert "nothing to stop" in err.value.message and "--dir" in (err.value.hint or "")
