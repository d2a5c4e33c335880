"""torchvision's memory-efficient DenseNet: the region is a closure over ``bn_function``.

``norm1`` runs inside the region (a true RC106 in training mode: 3 buffers per layer), ``norm2``
after the checkpoint returned, outside it: watch() reported its statistics as changed between
forward and recompute (174 false findings on DenseNet-121); only the region's own are compared.
"""

from __future__ import annotations

from library_env import require

torch = require("torch")
torchvision = require("torchvision")

import recheck  # noqa: E402


def test_densenet_reports_the_batchnorm_inside_the_region_only():
    torch.manual_seed(0)
    model = torchvision.models.densenet121(weights=None, memory_efficient=True)
    model.train()
    with recheck.watch(raise_on_finding=False) as w:
        model(torch.randn(2, 3, 32, 32)).sum().backward()
    report = w.report
    assert report.stats["invocations"] == report.stats["verified"] == 58, report.stats
    assert len(report.findings) == 3 * 58 and report.kinds == {"buffer"}, str(report)[:2000]
    assert all(".norm1." in f.subject or f.subject.startswith("buffer `self.norm1.") for f in report), \
        sorted({f.subject for f in report})[:10]
    assert all(f.code == "RC106" for f in report)
