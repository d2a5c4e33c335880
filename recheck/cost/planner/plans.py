"""A checkpointing plan: which modules to checkpoint and how, as data a user can keep and apply.

Plain data (no torch); the JSON form is in docs/cost.md.  ``modules``: dotted paths under the
root module (as ``named_modules()`` spells them) whose forward is checkpointed, ``full`` (save
the inputs, recompute everything) or ``selective`` (also save the outputs of ``selective_ops``).
``regions``: the step's own checkpoint calls that are not a module of the plan, each kept as
written or not; :func:`recheck.apply_plan` cannot edit code, so the user removes the others.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FORMAT_VERSION", "PLAN_VARIANTS", "SELECTIVE_OPS", "Plan", "PlanError", "RegionChoice", "load_plan"]

#: The plan format written and read.
FORMAT_VERSION = 1
#: What a plan does with a module: checkpoint it fully, or selectively.
PLAN_VARIANTS = ("full", "selective")
#: The operators whose outputs the selective variant saves (torchtitan's choice): matrix
#: products and attention; everything else in the module is recomputed in backward.
SELECTIVE_OPS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten._scaled_dot_product_flash_attention",
                 "aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_efficient_attention",
                 "aten._scaled_dot_product_cudnn_attention")


class PlanError(ValueError):
    """A plan that cannot be read or applied; the message says what is wrong and where."""


@dataclass(frozen=True)
class RegionChoice:
    """One of the step's own checkpoint calls that is not a module: kept as written or removed."""

    region: str
    keep: bool

    def to_dict(self) -> dict[str, Any]:
        return {"region": self.region, "keep": self.keep}


@dataclass(frozen=True)
class Plan:
    """Modules to checkpoint (path -> variant) and the step's other checkpoint calls kept or not."""

    modules: tuple[tuple[str, str], ...] = ()
    regions: tuple[RegionChoice, ...] = ()
    root: str = ""
    selective_ops: tuple[str, ...] = SELECTIVE_OPS

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for path, variant in self.modules:
            if not isinstance(path, str):
                raise PlanError(f"a module path must be a string, got {path!r}")
            if variant not in PLAN_VARIANTS:
                raise PlanError(f"module {path!r}: unknown variant {variant!r} (one of {', '.join(PLAN_VARIANTS)})")
            if path in seen:
                raise PlanError(f"module {path!r} is listed twice")
            seen.add(path)
        nested = [(a, b) for a in seen for b in seen if a != b and (a == "" or b.startswith(a + "."))]
        if nested:
            outer, inner = sorted(nested)[0]
            raise PlanError(f"module {inner!r} is inside {outer or 'the root'!r}: a plan checkpoints a module "
                            "or the modules inside it, not both")

    @property
    def variants(self) -> dict[str, str]:
        """``{path: variant}`` of every checkpointed module."""
        return dict(self.modules)

    def variant(self, path: str) -> str:
        """``full``, ``selective`` or ``none`` for the module at ``path``."""
        return self.variants.get(path, "none")

    def kept_regions(self) -> frozenset[str]:
        """Names of the step's own non-module checkpoint calls the plan keeps."""
        return frozenset(r.region for r in self.regions if r.keep)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (see the module docstring)."""
        return {"recheck_plan": FORMAT_VERSION, "root": self.root,
                "modules": [{"path": p, "variant": v} for p, v in self.modules],
                "regions": [r.to_dict() for r in self.regions], "selective_ops": list(self.selective_ops)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """Read a plan written by :meth:`to_dict`; :class:`PlanError` says what is wrong."""
        if not isinstance(data, dict):
            raise PlanError(f"a plan is a JSON object, got {type(data).__name__}")
        version = data.get("recheck_plan")
        if version != FORMAT_VERSION:
            raise PlanError(f"not a recheck plan of format {FORMAT_VERSION} (\"recheck_plan\": {version!r})")
        modules = data.get("modules", [])
        if not isinstance(modules, list):
            raise PlanError("\"modules\" must be a list of {\"path\", \"variant\"} objects")
        pairs = []
        for index, item in enumerate(modules):
            if not isinstance(item, dict) or "path" not in item:
                raise PlanError(f"modules[{index}] must be an object with \"path\" and \"variant\", got {item!r}")
            pairs.append((item["path"], item.get("variant", "full")))
        regions = []
        for index, item in enumerate(data.get("regions", [])):
            if not isinstance(item, dict) or not isinstance(item.get("region"), str) or \
                    not isinstance(item.get("keep"), bool):
                raise PlanError(f"regions[{index}] must be an object with \"region\" (text) and \"keep\" "
                                f"(true or false), got {item!r}")
            regions.append(RegionChoice(item["region"], item["keep"]))
        ops = data.get("selective_ops", list(SELECTIVE_OPS))
        if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
            raise PlanError("\"selective_ops\" must be a list of operator names such as \"aten.mm\"")
        root = data.get("root", "")
        return cls(tuple(pairs), tuple(regions), root if isinstance(root, str) else "", tuple(ops))

    def describe(self) -> str:
        """A short human form: ``blocks.0 full, blocks.2 selective`` (``nothing checkpointed``)."""
        parts = [f"{p} {v}" for p, v in self.modules]
        parts += [f"{r.region} as written" for r in self.regions if r.keep]
        return ", ".join(parts) if parts else "nothing checkpointed"


def load_plan(plan: Plan | dict[str, Any] | str | Path) -> Plan:
    """A :class:`Plan` from a plan, its dict, its JSON text or a path to a JSON file."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return Plan.from_dict(plan)
    if isinstance(plan, (str, Path)):
        text = str(plan)
        if not text.lstrip().startswith("{"):
            try:
                text = Path(plan).read_text(encoding="utf-8")
            except OSError as exc:
                raise PlanError(f"cannot read the plan file {str(plan)!r}: {exc.strerror or exc}") from None
        try:
            return Plan.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise PlanError(f"the plan is not valid JSON: {exc}") from None
    raise PlanError(f"a plan is a recheck Plan, a dict, JSON text or a path, got {type(plan).__name__}")

