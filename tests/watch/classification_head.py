"""A sequence-classification model in plain torch, shaped like transformers' ``*ForSequenceClassification``.

Every decoder layer holds the model's ``config``, whose ``repr`` is its JSON over several
lines (as ``PretrainedConfig.__repr__`` prints it).  The head sets ``config.problem_type``
the first time it computes a loss: after the checkpointed layers ran and before backward
recomputes them.  Nothing the layers compute reads ``problem_type``.

``recheck check --step tests/watch/classification_head.py:train_step`` runs one step of it.
"""

from __future__ import annotations

import json
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Config:
    """A model configuration that prints itself as indented JSON, over many lines."""

    def __init__(self, hidden_size: int = 16, num_hidden_layers: int = 2, num_labels: int = 3,
                 problem_type: str | None = None, **extra: object) -> None:
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_labels = num_labels
        self.problem_type = problem_type
        self.__dict__.update(extra)

    def to_json_string(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n"

    def __repr__(self) -> str:
        return f"{type(self).__name__} {self.to_json_string()}"


class DecoderLayer(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.norm = nn.LayerNorm(config.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, 2 * config.hidden_size), nn.GELU(),
                                 nn.Linear(2 * config.hidden_size, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.mlp(self.norm(hidden_states))


class Model(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Linear(config.hidden_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False
        self._gradient_checkpointing_func = checkpoint

    def gradient_checkpointing_enable(self, use_reentrant: bool = False) -> None:
        self.gradient_checkpointing = True
        self._gradient_checkpointing_func = partial(checkpoint, use_reentrant=use_reentrant)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed(inputs)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(layer.__call__, hidden_states)
            else:
                hidden_states = layer(hidden_states)
        return hidden_states


class ForSequenceClassification(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.num_labels = config.num_labels
        self.model = Model(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        logits = self.score(self.model(inputs)[:, -1])
        loss = None
        if labels is not None:
            if self.config.problem_type is None:  # decided once, at the first loss
                if self.num_labels == 1:
                    self.config.problem_type = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    self.config.problem_type = "single_label_classification"
                else:
                    self.config.problem_type = "multi_label_classification"
            if self.config.problem_type == "regression":
                loss = nn.functional.mse_loss(logits.squeeze(), labels.squeeze())
            elif self.config.problem_type == "single_label_classification":
                loss = nn.functional.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1))
            else:
                loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
        return loss, logits


def build(use_reentrant: bool = False, seed: int = 0, checkpointed: bool = True,
          problem_type: str | None = None) -> tuple[ForSequenceClassification, torch.Tensor, torch.Tensor]:
    """A fresh model (``problem_type`` unset unless given), its inputs and labels."""
    torch.manual_seed(seed)
    config = Config(problem_type=problem_type, vocab_size=32, architectures=["ForSequenceClassification"],
                    id2label={"0": "negative", "1": "neutral", "2": "positive"})
    model = ForSequenceClassification(config).train()
    if checkpointed:
        model.model.gradient_checkpointing_enable(use_reentrant=use_reentrant)
    inputs = torch.randn(4, 5, config.hidden_size, requires_grad=use_reentrant)
    labels = torch.tensor([0, 2, 1, 0])
    return model, inputs, labels


MODEL, INPUTS, LABELS = build()
OPTIMIZER = torch.optim.SGD(MODEL.parameters(), lr=0.1)


def train_step() -> None:
    """One fine-tuning step, as a Trainer runs it: the first step sets ``config.problem_type``."""
    OPTIMIZER.zero_grad()
    loss, _ = MODEL(INPUTS, LABELS)
    loss.backward()
    OPTIMIZER.step()
