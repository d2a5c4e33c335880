"""The checkpoint entry points recheck knows, each stated once.

One :class:`EntryPoint` per implementation (torch's own, FSDP's wrapper, the composable API, timm,
transformers, DeepSpeed, Megatron-core, fairscale, Transformer Engine, xformers, colossalai) says
how the linter recognises a call of it (``names``, ``attributes``, ``classes``, ``bases``, the
region's ``position``), its semantics (``reentrant`` by default and the keyword that chooses,
whether it restores RNG state and the keyword that turns it off) and how a run bypasses it
(:class:`Intercept`).  ``recheck.lint.targets`` and ``recheck.intercept.implementations`` both
derive their tables from :data:`TABLE`.  Standard library only: the linter runs without torch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TABLE", "TORCH_CHECKPOINT", "TORCH_GENERATOR", "EntryPoint", "Intercept"]

#: Bypassed through the patch of ``torch.utils.checkpoint.checkpoint`` (``recheck.intercept.patches``).
TORCH_CHECKPOINT = "torch-checkpoint"
#: Bypassed through the patch of torch's non-reentrant generator (``recheck.intercept.patches``).
TORCH_GENERATOR = "torch-generator"


@dataclass(frozen=True)
class Intercept:
    """How recheck intercepts (and bypasses) an entry point at run time.

    ``kind`` is :data:`TORCH_CHECKPOINT`, :data:`TORCH_GENERATOR`, or the name of an adapter of
    ``recheck.intercept.implementations`` (its class there when the default ``Adapter`` does not
    describe it).  An adapter patches ``target`` (a dotted attribute path) inside ``module``;
    ``function_index`` is where the region function is among the patched callable's positional
    arguments, ``options_after`` how many after it are the implementation's own, and
    ``needs_input_grad`` whether the output requires grad only when an input does.
    """

    kind: str
    module: str = ""
    target: str = ""
    function_index: int = 0
    options_after: int = 0
    needs_input_grad: bool = True

    @property
    def adapter(self) -> bool:
        """Whether an adapter of ``recheck.intercept.implementations`` patches it."""
        return bool(self.module)


@dataclass(frozen=True)
class EntryPoint:
    """One checkpoint entry point (see the module docstring)."""

    library: str
    names: tuple[str, ...] = ()
    reentrant: bool = False
    reentrant_keyword: str | None = "use_reentrant"
    restores_rng: bool = True
    rng_keyword: str | None = "preserve_rng_state"
    position: int = 0
    policy: bool = False  # the region is picked by check_fn/auto_wrap_policy (apply_activation_checkpointing)
    attributes: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    bases: tuple[str, ...] = ()
    intercept: Intercept | None = None


_WRAPPER = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
_DEEPSPEED = "deepspeed.runtime.activation_checkpointing.checkpointing"
_MEGATRON = "megatron.core.tensor_parallel.random"
_TORCH = Intercept(TORCH_CHECKPOINT)

#: Every known entry point.  Adding one is a record here (and an adapter class in
#: ``recheck.intercept.implementations`` when the default adapter does not describe it).
TABLE: tuple[EntryPoint, ...] = (
    # torch: leaving use_reentrant out warns and runs the reentrant implementation
    EntryPoint("torch", ("torch.utils.checkpoint.checkpoint",), reentrant=True, intercept=_TORCH),
    EntryPoint("torch", ("torch.utils.checkpoint.checkpoint_sequential",), reentrant=True, intercept=_TORCH),
    # FSDP's wrapper: CheckpointImpl.NO_REENTRANT by default, torch's checkpoint underneath
    EntryPoint("torch", (f"{_WRAPPER}.checkpoint_wrapper",), reentrant_keyword="checkpoint_impl", intercept=_TORCH),
    EntryPoint("torch", (f"{_WRAPPER}.apply_activation_checkpointing",), reentrant_keyword="checkpoint_impl",
               policy=True, intercept=_TORCH),
    # the composable checkpoint(module): drives the non-reentrant generator without calling checkpoint()
    EntryPoint("torch", ("torch.distributed._composable.checkpoint",
                         "torch.distributed._composable.checkpoint_activation.checkpoint"),
               reentrant_keyword=None, intercept=Intercept(TORCH_GENERATOR)),
    # timm: torch's checkpoint, non-reentrant by default
    EntryPoint("timm", tuple(f"timm.models.{m}{f}" for m in ("_manipulate.", "helpers.", "")
                             for f in ("checkpoint", "checkpoint_seq")), intercept=_TORCH),
    # transformers: gradient_checkpointing_enable() binds a partial of torch's checkpoint (use_reentrant=True
    # unless gradient_checkpointing_kwargs say otherwise); GradientCheckpointingLayer subclasses call it
    EntryPoint("transformers", attributes=("_gradient_checkpointing_func",), bases=("GradientCheckpointingLayer",),
               reentrant=True, intercept=_TORCH),
    # DeepSpeed: its own autograd.Function (reentrant), always restores CPU/CUDA RNG
    EntryPoint("DeepSpeed", tuple(f"deepspeed.{m}.checkpoint" for m in ("checkpointing", "runtime.activation_checkpointing.checkpointing")),
               reentrant=True, reentrant_keyword=None, rng_keyword=None,
               intercept=Intercept("deepspeed", _DEEPSPEED, "CheckpointFunction.apply")),
    EntryPoint("DeepSpeed", tuple(f"deepspeed.{m}.non_reentrant_checkpoint"
                                  for m in ("checkpointing", "runtime.activation_checkpointing.checkpointing")),
               reentrant_keyword=None, rng_keyword=None,
               intercept=Intercept("deepspeed-non-reentrant", _DEEPSPEED, "non_reentrant_checkpoint",
                                   needs_input_grad=False)),
    # Megatron: checkpoint(function, distribute_saved_activations, *args), reentrant, RNG tracker restored
    EntryPoint("Megatron", ("megatron.core.tensor_parallel.checkpoint", f"{_MEGATRON}.checkpoint"),
               reentrant=True, reentrant_keyword=None, rng_keyword=None,
               intercept=Intercept("megatron", _MEGATRON, "CheckpointFunction.apply", options_after=1)),
    # Megatron's CheckpointWithoutOutput().checkpoint(function, *args): recomputed in a grad hook
    EntryPoint("Megatron", (f"{_MEGATRON}.CheckpointWithoutOutput.checkpoint",
                            "megatron.core.tensor_parallel.CheckpointWithoutOutput.checkpoint"),
               reentrant=True, reentrant_keyword=None, rng_keyword=None, classes=("CheckpointWithoutOutput",),
               intercept=Intercept("megatron-without-output", _MEGATRON, "CheckpointWithoutOutput.checkpoint",
                                   function_index=1)),
    EntryPoint("Megatron", ("megatron.core.extensions.transformer_engine.te_checkpoint",),
               reentrant_keyword=None, rng_keyword=None),
    # Transformer Engine: use_reentrant defaults to True
    EntryPoint("Transformer Engine", tuple(f"transformer_engine.pytorch.{m}checkpoint" for m in ("", "distributed.")),
               reentrant=True, rng_keyword=None),
    # xformers: torch's non-reentrant checkpoint underneath
    EntryPoint("xformers", ("xformers.checkpoint.checkpoint", "xformers.checkpoint",
                            "xformers.checkpoint.selective_checkpoint_wrapper"), intercept=_TORCH),
    # fairscale: its own autograd.Function (reentrant), RNG state saved and restored
    EntryPoint("fairscale", tuple(f"fairscale.nn.{m}checkpoint_wrapper"
                                  for m in ("", "checkpoint.", "checkpoint.checkpoint_activations.")),
               reentrant=True, reentrant_keyword=None, rng_keyword=None,
               intercept=Intercept("fairscale", "fairscale.nn.checkpoint.checkpoint_activations",
                                   "CheckpointFunction.apply", function_index=1, needs_input_grad=False)),
    EntryPoint("fairscale", ("fairscale.nn.model_parallel.random.checkpoint",),
               reentrant=True, reentrant_keyword=None, rng_keyword=None),
    # colossalai: checkpoint(function, activation_offload, *args, use_reentrant=True)
    EntryPoint("colossalai", tuple(f"colossalai.{m}checkpoint" for m in (
        "legacy.utils.", "legacy.utils.activation_checkpoint.", "utils.", "utils.activation_checkpoint.")),
               reentrant=True, rng_keyword=None),
)
