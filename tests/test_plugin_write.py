"""``mx-strategies plugin`` against the ModelExpress installed (issue 46).

ModelExpress 0.7 reads no plugin folder: ``--write`` alone refuses with one line and exit 2 and creates
nothing (it used to create /opt/modelexpress/plugins); ``--write DIR`` writes where told and says 0.7 will
not read it. On a ModelExpress that takes plugins (0.8) ``--write`` writes into MX_PLUGIN_DIR, silently.
Which one is installed is asked of :func:`mx_strategies.releases.chain_takes_plugins`, as the command does.
"""

from __future__ import annotations

from importlib import metadata

import pytest

from mx_strategies import cli
from mx_strategies.modelexpress_plugin import DEFAULT_PLUGIN_DIR, PLUGIN_FILE
from mx_strategies.releases import chain_takes_plugins

TAKES_PLUGINS = chain_takes_plugins()
RELEASE = metadata.version("modelexpress")
only_without_plugins = pytest.mark.skipif(TAKES_PLUGINS, reason=f"ModelExpress {RELEASE} reads a plugin folder")
ENVIRONMENT_LINES = "MX_LOAD_PLUGIN=robust_model_streamer\nMX_LOAD_PLUGIN_BEFORE=model_streamer\n"


def run_plugin(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["plugin", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@only_without_plugins
def test_write_without_a_folder_refuses_on_a_release_without_plugins(capsys, monkeypatch, tmp_path):
    folder = tmp_path / "plugins"
    monkeypatch.setenv("MX_PLUGIN_DIR", str(folder))

    assert run_plugin(capsys, "--write") == (
        2,
        "",
        (
            f"mx-strategies plugin: ModelExpress {RELEASE} (installed here) has no plugin folder, nothing written; "
            "activate robust with MX_STRATEGY=mx_strategies.robust, or pass --write DIR to write the file for a "
            "0.8 image\n"
        ),
    )
    assert not folder.exists()


@only_without_plugins
def test_write_does_not_create_the_default_folder(capsys, monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("MX_PLUGIN_DIR", raising=False)
    existed = Path(DEFAULT_PLUGIN_DIR).exists()

    code, out, err = run_plugin(capsys, "--write")

    assert (code, out) == (2, "") and err.count("\n") == 1
    assert Path(DEFAULT_PLUGIN_DIR).exists() == existed


@only_without_plugins
def test_write_into_a_named_folder_writes_and_says_it_will_not_be_read(capsys, tmp_path):
    folder = tmp_path / "for-0.8-image"
    written = folder / PLUGIN_FILE.name

    assert run_plugin(capsys, "--write", str(folder)) == (
        0,
        f"wrote {written}\n{ENVIRONMENT_LINES}",
        (
            f"note: ModelExpress {RELEASE} (installed here) will not read {written}: it has no plugin folder; "
            "on it set MX_STRATEGY=mx_strategies.robust\n"
        ),
    )
    assert written.read_bytes() == PLUGIN_FILE.read_bytes()


@only_without_plugins
def test_printing_says_how_to_activate_on_a_release_without_plugins(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MX_PLUGIN_DIR", str(tmp_path))

    assert run_plugin(capsys) == (
        0,
        (
            f"plugin file: {PLUGIN_FILE}\nplugin folder: {tmp_path} (MX_PLUGIN_DIR)\n{ENVIRONMENT_LINES}"
            f"note: ModelExpress {RELEASE} (installed here) reads no plugin folder; on it set "
            "MX_STRATEGY=mx_strategies.robust\n"
        ),
        "",
    )


@pytest.mark.skipif(not TAKES_PLUGINS, reason=f"ModelExpress {RELEASE} reads no plugin folder")
def test_write_on_a_release_with_plugins_writes_into_mx_plugin_dir(capsys, monkeypatch, tmp_path):
    folder = tmp_path / "plugins"
    monkeypatch.setenv("MX_PLUGIN_DIR", str(folder))
    written = folder / PLUGIN_FILE.name

    assert run_plugin(capsys, "--write") == (0, f"wrote {written}\n{ENVIRONMENT_LINES}", "")
    assert written.read_bytes() == PLUGIN_FILE.read_bytes()
