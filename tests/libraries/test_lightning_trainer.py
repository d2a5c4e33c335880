"""recheck.integrations.lightning_trainer: the first batches of a real Lightning ``Trainer.fit``.

A 2-layer model whose layers are checkpointed the way a LightningModule usually does it (a
flag on the module, ``torch.utils.checkpoint`` in ``forward``), trained on CPU with AdamW;
the hazard is BatchNorm in training mode inside a checkpointed layer (its running
statistics are updated again on recompute).
"""

from __future__ import annotations

import csv
import logging

import pytest
from library_env import logged, require

torch = require("torch")
pl = require("lightning.pytorch")

import torch.utils.checkpoint as torch_checkpoint  # noqa: E402
from torch import nn  # noqa: E402

import recheck  # noqa: E402
from recheck.integrations.lightning_trainer import LOGGER_NAME, RecheckCallback  # noqa: E402

ORIGINAL_CHECKPOINT = torch_checkpoint.checkpoint


class layer(nn.Module):  # noqa: N801 - lowercase, as real code names its blocks
    def __init__(self, width: int, norm: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width) if norm else nn.LayerNorm(width)

    def forward(self, x):
        return torch.relu(self.norm(self.linear(x)))


class Regressor(pl.LightningModule):
    def __init__(self, norm: bool = False, checkpointing: bool = True) -> None:
        super().__init__()
        self.layers = nn.ModuleList([layer(8, norm) for _ in range(2)])
        self.head = nn.Linear(8, 1)
        self.checkpointing = checkpointing

    def forward(self, x):
        for block in self.layers:
            if self.checkpointing and self.training:
                x = torch_checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=generator)
    dataset = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    return torch.utils.data.DataLoader(dataset, batch_size=4)


def fit(tmp_path, callback, module, max_steps: int = 4):
    torch.manual_seed(0)
    trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, callbacks=[callback],
                         logger=pl.loggers.CSVLogger(str(tmp_path)), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         log_every_n_steps=1)
    trainer.fit(module, data())
    return trainer


@pytest.fixture
def messages():
    """What the callback logs through its logger."""
    with logged(LOGGER_NAME) as records:
        yield records


def logged_metrics(trainer) -> list[dict]:
    with open(trainer.logger.experiment.metrics_file_path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_first_batches_are_watched_clean_and_logged_as_metrics(tmp_path, messages):
    callback = RecheckCallback(steps=2)
    trainer = fit(tmp_path, callback, Regressor())
    assert callback.report.ok, str(callback.report)
    assert callback.report.stats["invocations"] == callback.report.stats["verified"] == 2 * 2
    assert torch_checkpoint.checkpoint is ORIGINAL_CHECKPOINT
    rows = [r for r in logged_metrics(trainer) if r.get("recheck/verified")]
    assert [(float(r["recheck/verified"]), float(r["recheck/findings"])) for r in rows] == [(2.0, 0.0), (2.0, 0.0)]
    assert [r.levelno for r in messages] == [logging.INFO] * 3
    assert messages[-1].getMessage().startswith("recheck: watched the first 2 training step(s): 4 checkpoint call(s)")


def test_batchnorm_in_a_checkpointed_layer_is_a_logged_finding(tmp_path, messages):
    callback = RecheckCallback(steps=1)
    trainer = fit(tmp_path, callback, Regressor(norm=True))
    assert trainer.global_step == 4  # training went on
    assert "buffer" in callback.report.kinds
    warning = next(r for r in messages if r.levelno == logging.WARNING).getMessage()
    assert "running_mean" in warning and "recheck explain RC106" in warning
    rows = [r for r in logged_metrics(trainer) if r.get("recheck/findings")]
    assert float(rows[0]["recheck/findings"]) >= 1


def test_fail_fast_stops_fit_and_leaves_nothing_patched(tmp_path):
    callback = RecheckCallback(steps=2, fail_fast=True)
    module = Regressor(norm=True)
    with pytest.raises(recheck.RecomputeMismatch) as caught:
        fit(tmp_path, callback, module)
    assert "buffer" in caught.value.report.kinds
    assert module.trainer.global_step == 1
    assert torch_checkpoint.checkpoint is ORIGINAL_CHECKPOINT
    assert not callback.window.watching


def test_a_step_that_raises_closes_its_watch(tmp_path):
    class Broken(Regressor):
        def training_step(self, batch, batch_idx):
            self(batch[0])
            raise RuntimeError("the step broke")

    callback = RecheckCallback(steps=2)
    with pytest.raises(RuntimeError, match="the step broke"):
        fit(tmp_path, callback, Broken())
    assert not callback.window.watching  # on_exception closed it
    assert torch_checkpoint.checkpoint is ORIGINAL_CHECKPOINT


def test_a_module_without_checkpointing_is_said_so(tmp_path, messages):
    callback = RecheckCallback(steps=1)
    fit(tmp_path, callback, Regressor(checkpointing=False), max_steps=1)
    assert "no checkpoint call was made" in messages[0].getMessage()


def test_watch_options_are_passed_through(tmp_path):
    callback = RecheckCallback(steps=1, early_stop=False)
    fit(tmp_path, callback, Regressor(), max_steps=1)
    assert any("early_stop=False" in note for note in callback.report.notes)
