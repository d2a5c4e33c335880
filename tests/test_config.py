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
    assert str(err.value).startswith(f"{path}: selecct: unknown key")


def test_wrong_type_names_file_key_and_expectation(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.recheck]\nstore = "everything"\n')
    with pytest.raises(ConfigError, match=r": store: invalid value .*\"digest\" or \"copy\""):
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
    assert capsys.readouterr().err.startswith(f"recheck: {tmp_path / 'pyproject.toml'}: bogus: unknown key")


# --- a stranger's pyproject.toml is a config error, never a traceback (issue 40, item 7) ---

BAD_FILES = {
    "not_utf8": (b"[tool.recheck]\nselect = ['\xff']\n", "not valid UTF-8 (invalid byte 0xff at offset 26)"),
    "deep_array": (b"[tool.recheck]\nselect = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply to parse"),
    "deep_table": (b"x = " + b"{a = " * 5000 + b"1" + b"}" * 5000 + b"\n", "nested too deeply to parse"),
    "huge_size": (b"[tool.recheck]\nmax-file-size = 9223372036854775807\n",
                  "max-file-size: invalid value in [tool.recheck]: expected a positive number of bytes, at most"),
    "too_large": (b"# " + b"x" * (4 * 1024 * 1024) + b"\n[tool.recheck]\n", "larger than 4194304 bytes"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_contents_are_config_errors_naming_the_file(tmp_path, name):
    content, reason = BAD_FILES[name]
    path = tmp_path / "pyproject.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert str(err.value).startswith(f"{path}: {reason}")


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_pyproject_above_the_linted_folder_exits_2_with_one_line(tmp_path, monkeypatch, capsys, name):
    from recheck.cli import main

    content, reason = BAD_FILES[name]
    (tmp_path / "pyproject.toml").write_bytes(content)
    inner = tmp_path / "src" / "pkg"
    inner.mkdir(parents=True)
    (inner / "m.py").write_text("x = 1\n")
    monkeypatch.chdir(inner)
    assert main(["lint", "--no-cache", "."]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"recheck: {tmp_path / 'pyproject.toml'}: {reason}") and err.count("\n") == 1, err


def test_max_file_size_at_the_limit_is_accepted(tmp_path):
    from recheck.config import MAX_FILE_SIZE_LIMIT

    write(tmp_path / "pyproject.toml", f"[tool.recheck]\nmax-file-size = {MAX_FILE_SIZE_LIMIT}\n")
    assert load_config(tmp_path).get("max_file_size") == MAX_FILE_SIZE_LIMIT
