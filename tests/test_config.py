"""[tool.recheck] loading: discovery, normalization, errors that name file and key."""

import pytest

from recheck.config import Config, ConfigError, find_pyproject, load_config


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_nearest_pyproject_with_a_recheck_table_wins(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.recheck]\nignore = ["RC103"]\n')
    inner = tmp_path / "pkg" / "sub"
    inner.mkdir(parents=True)
    write(tmp_path / "pkg" / "pyproject.toml", "[project]\nname = 'x'\n")  # no [tool.recheck]: skipped
    config = load_config(inner)
    assert config.path == tmp_path / "pyproject.toml"
    assert config.values == {"ignore": ["RC103"]}
    assert config.root == tmp_path


def test_kebab_and_snake_keys_are_normalized(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.recheck]\nper-file-ignores = {"t/*" = ["RC104"]}\nextend_select = ["RC2"]\n')
    config = load_config(tmp_path)
    assert config.get("per-file-ignores") == {"t/*": ["RC104"]}
    assert config.get("extend_select") == ["RC2"]


def test_no_configuration_gives_defaults(tmp_path):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
    found = find_pyproject(tmp_path)
    assert found is None or tmp_path not in found.parents
    assert Config().values == {} and Config().path is None


def test_unknown_key_names_file_and_key(tmp_path):
    path = write(tmp_path / "pyproject.toml", "[tool.recheck]\nselecct = ['RC1']\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert str(path) in str(err.value) and "'selecct'" in str(err.value)


def test_wrong_type_names_file_key_and_expectation(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.recheck]\nstore = "everything"\n')
    with pytest.raises(ConfigError, match=r"invalid value for 'store'.*\"digest\" or \"copy\""):
        load_config(tmp_path)


def test_duplicate_key_in_two_spellings(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.recheck]\nextend-select = ["RC1"]\nextend_select = ["RC2"]\n')
    with pytest.raises(ConfigError, match="given twice"):
        load_config(tmp_path)


def test_broken_toml_is_a_config_error(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.recheck\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path=tmp_path / "pyproject.toml")


def test_flags_override_the_file(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.recheck]\nstrict = false\nstore = "copy"\n')
    merged = load_config(tmp_path).merged({"strict": True, "store": None})
    assert merged.values == {"strict": True, "store": "copy"}


def test_cli_reports_config_errors_with_exit_2(tmp_path, monkeypatch, capsys):
    from recheck.cli import main

    write(tmp_path / "pyproject.toml", "[tool.recheck]\nbogus = 1\n")
    monkeypatch.chdir(tmp_path)

    def boom(ns):
        load_config()

    import argparse

    from recheck import cli

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    ns = argparse.Namespace(_run=boom)
    monkeypatch.setattr(parser, "parse_args", lambda argv: ns)
    assert main([]) == 2
    assert "unknown key 'bogus'" in capsys.readouterr().err
