"""``recheck check``: targets, exit codes, text and JSON output, the user's traceback."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from recheck.loading import TargetError, build_region, load_target
from recheck.cli import main

REGIONS = textwrap.dedent('''
    import torch
    from torch import nn

    CHECK_OPTIONS = {"region_unpreserved": {"preserve_rng_state": False}}


    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return torch.tanh(self.lin(x))


    def region_clean():
        torch.manual_seed(0)
        return nn.Linear(3, 3), (torch.randn(2, 3),)


    def region_counter():
        return Counter(), (torch.randn(2, 3),), {}


    def region_unpreserved():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)), (torch.randn(4, 3),)


    def helper_not_a_region():
        raise AssertionError("never called")
''')


@pytest.fixture
def regions(tmp_path):
    path = tmp_path / "regions.py"
    path.write_text(REGIONS)
    return path


def test_load_target_forms(regions, tmp_path, monkeypatch):
    names = [t.label.rsplit(":", 1)[1] for t in load_target(str(regions))]
    assert names == ["region_clean", "region_counter", "region_unpreserved"]
    (target,) = load_target(f"{regions}:region_unpreserved")
    assert target.options == {"preserve_rng_state": False}
    region = build_region(target)
    assert callable(region.fn) and region.kwargs == {}
    monkeypatch.syspath_prepend(str(tmp_path))
    (target,) = load_target("regions:region_counter")
    assert build_region(target).fn.calls == 0
    for bad, message in [(f"{tmp_path}/missing.py", "no such file"),
                         (f"{regions}:nope", "no attribute 'nope'"),
                         ("regions", "expected file.py"),
                         ("no_such_module_xyz:f", "no module named")]:
        with pytest.raises(TargetError, match=message):
            load_target(bad)


def test_exit_codes_and_text_output(regions, capsys):
    assert main(["check", f"{regions}:region_clean"]) == 0
    out = capsys.readouterr().out
    assert "recheck: no difference found" in out
    assert out.rstrip().endswith("recheck: checked 1 region: 0 with findings (0 differences), 1 clean")
    assert main(["check", str(regions)]) == 1
    out = capsys.readouterr().out
    assert out.count("recheck: recomputation differs from the original forward") == 2
    assert "attribute `self.calls`" in out and "cpu RNG" in out
    assert "checked 3 regions: 2 with findings" in out


def test_json_output(regions, capsys):
    assert main(["check", str(regions), "--format", "json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    by_target = {r["target"].rsplit(":", 1)[1]: r for r in payload["reports"]}
    assert by_target["region_clean"]["ok"] is True
    assert {f["kind"] for f in by_target["region_counter"]["findings"]} == {"state"}
    assert "rng" in {f["kind"] for f in by_target["region_unpreserved"]["findings"]}
    assert payload["summary"]["regions"] == 3 and payload["summary"]["with_findings"] == 2


def test_command_line_options_override(regions, capsys):
    assert main(["check", f"{regions}:region_unpreserved", "--preserve-rng-state"]) == 0
    assert main(["check", f"{regions}:region_counter", "--use-reentrant"]) == 1
    assert "use_reentrant=True" in capsys.readouterr().out


def test_import_error_shows_the_users_traceback(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\n\ndef helper():\n    return 1 / 0\n\n\nVALUE = helper()\n")
    assert main(["check", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError" in err
    assert "broken.py" in err and "line 5, in helper" in err
    assert "recheck/checker" not in err and "importlib" not in err


def test_region_errors_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent('''
        import torch

        def _fails(x):
            raise RuntimeError("region failed")

        def region_raises():
            return _fails, (torch.ones(2, requires_grad=True),)

        def region_no_tensor():
            return (lambda x: "text"), (torch.ones(2, requires_grad=True),)

        def region_wrong_shape():
            return 3
    '''))
    assert main(["check", f"{bad}:region_raises"]) == 2
    err = capsys.readouterr().err
    assert "region failed" in err and "bad.py" in err and "in _fails" in err
    assert main(["check", f"{bad}:region_no_tensor"]) == 2
    assert "returned no tensor" in capsys.readouterr().err
    assert main(["check", f"{bad}:region_wrong_shape"]) == 2
    assert "must return (region, args)" in capsys.readouterr().err


def test_command_module_does_not_import_torch():
    import subprocess

    code = ("import sys, recheck.commands.check as c, argparse; p = argparse.ArgumentParser(); "
            "c.add_arguments(p); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
