"""timm's set_grad_checkpointing: ResNet's BatchNorm is reported as `buffer`, ViT is clean."""

from __future__ import annotations

from library_env import require

torch = require("torch")
timm = require("timm")

import recheck  # noqa: E402


def test_resnet_batchnorm_statistics_updated_twice():
    torch.manual_seed(0)
    model = timm.create_model("resnet10t", pretrained=False, num_classes=10)
    model.set_grad_checkpointing()
    model.train()
    with recheck.watch(raise_on_finding=False) as w:
        model(torch.randn(2, 3, 32, 32)).sum().backward()
    report = w.report
    assert report.stats["invocations"] >= 1 and report.stats["verified"] == report.stats["invocations"]
    assert report.kinds == {"buffer"}, str(report)
    assert all(f.message.startswith("BatchNorm statistics") for f in report)
    assert any("running_mean` updated again by the recompute" in f.message for f in report)


def test_resnet_in_eval_mode_is_clean():
    torch.manual_seed(0)
    model = timm.create_model("resnet10t", pretrained=False, num_classes=10)
    model.set_grad_checkpointing()
    model.eval()
    x = torch.randn(2, 3, 32, 32, requires_grad=True)
    with recheck.watch() as w:
        model(x).sum().backward()
    assert w.report.ok and w.report.stats["verified"] >= 1


def test_vit_with_dropout_runs_clean():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32,
                              patch_size=8, embed_dim=32, depth=2, num_heads=2,
                              drop_rate=0.1, attn_drop_rate=0.1, drop_path_rate=0.1)
    model.set_grad_checkpointing()
    model.train()
    with recheck.watch() as w:
        for _ in range(2):
            model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert w.report.ok, str(w.report)
    assert w.report.stats["invocations"] == 4
    assert w.report.stats["verified"] == 4


import pytest  # noqa: E402


@pytest.mark.parametrize(("reentrant", "replaced", "made_again"), [(True, 12, 12), (False, 0, 8)])
def test_poolformer_s_nested_checkpoints_are_all_verified(reentrant, replaced, made_again):
    # MetaFormer checkpoints each stage's blocks and the stages: before, 28 calls and 16 verified
    # (12 "without grad") reentrant, 24 and 16 (8 "never recomputed") non-reentrant
    import warnings

    import timm.layers

    was = timm.layers.use_reentrant_ckpt()
    timm.layers.set_reentrant_ckpt(reentrant)
    try:
        torch.manual_seed(0)
        model = timm.create_model("poolformer_s12", pretrained=False, num_classes=4)
        model.set_grad_checkpointing()
        model.train()
        with warnings.catch_warnings(), recheck.watch(raise_on_finding=False) as w:
            warnings.simplefilter("ignore")
            model(torch.randn(1, 3, 32, 32)).sum().backward()
    finally:
        timm.layers.set_reentrant_ckpt(was)
    stats = w.report.stats
    assert w.report.ok, str(w.report)
    assert stats["verified"] == stats["invocations"] and stats["never_recomputed"] == stats["without_grad"] == 0, stats
    assert (stats["replaced"], stats["made_again"]) == (replaced, made_again), stats
