"""Where the embedded broker keeps its store (videoflow.broker.server.store_dir_for and
default_store_dir): per user, per platform, overridable, or throwaway."""

from __future__ import annotations

from pathlib import Path

import pytest

from videoflow.broker.server import ENV_STORE_DIR, default_store_dir, store_dir_for


def test_linux_follows_xdg_data_home_else_local_share() -> None:
    assert default_store_dir("linux", {"XDG_DATA_HOME": "/data"}, "/home/u") == \
        Path("/data/videoflow/nats")
    assert default_store_dir("linux", {}, "/home/u") == \
        Path("/home/u/.local/share/videoflow/nats")
    # The XDG specification says a relative value is to be ignored.
    assert default_store_dir("linux", {"XDG_DATA_HOME": "rel"}, "/home/u") == \
        Path("/home/u/.local/share/videoflow/nats")


def test_macos_uses_application_support() -> None:
    assert default_store_dir("darwin", {"XDG_DATA_HOME": "/data"}, "/Users/u") == \
        Path("/Users/u/Library/Application Support/videoflow/nats")


def test_windows_uses_local_app_data() -> None:
    assert default_store_dir("win32", {"LOCALAPPDATA": "/appdata"}, "/users/u") == \
        Path("/appdata/videoflow/nats")
    assert default_store_dir("win32", {}, "/users/u") == \
        Path("/users/u/AppData/Local/videoflow/nats")


def test_a_given_store_wins_over_the_environment_which_wins_over_the_default(
        tmp_path: Path) -> None:
    env = {ENV_STORE_DIR: str(tmp_path / "env"), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    assert store_dir_for(tmp_path / "given", environ=env) == tmp_path / "given"
    assert store_dir_for(environ=env) == tmp_path / "env"
    assert store_dir_for(environ={"XDG_DATA_HOME": str(tmp_path / "xdg")}) == \
        tmp_path / "xdg" / "videoflow" / "nats"
    assert store_dir_for("~/s", environ={}) == Path.home() / "s"


def test_ephemeral_is_a_temporary_store_and_excludes_a_given_one(tmp_path: Path) -> None:
    assert store_dir_for(ephemeral=True, environ={ENV_STORE_DIR: str(tmp_path)}) is None
    with pytest.raises(ValueError, match="exclude each other"):
        store_dir_for(tmp_path, ephemeral=True)


def test_the_suite_never_uses_the_real_per_user_store() -> None:
    # tests/conftest.py points every test at a store under pytest's tmp dir.
    chosen = store_dir_for()
    assert chosen is not None and chosen != default_store_dir()
