"""What one pass over a file learns: plain, picklable data (the cache stores it).

The linter works in two phases.  Phase one reads a single file and records
:class:`FileFacts`: its classes, functions, the hazards inside each function body and
every checkpoint call site, with names already resolved through the file's imports.
Phase two (``regions.py``) joins the facts of all files to decide which functions are
actually checkpointed and turns their hazards into findings.  Nothing here imports
anything outside the standard library.

Most of a large file is never checkpointed, so phase one analyses the bodies of only the
top-level definitions that can matter (see :mod:`recheck.lint.outline`) and *outlines* the
others: their classes and functions are present with their names, places, bases and
methods, and the rest of their facts is filled in the first time phase two reads it
(:meth:`Deferred.defer`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple

__all__ = ["DYNAMIC_ATTRIBUTE", "CallSite", "ClassFacts", "Deferred", "FileFacts", "FunctionFacts", "Hazard", "Ref",
           "Span"]

#: The key of :attr:`ClassFacts.attributes` for modules added under a name computed at run
#: time (``self.add_module(*stage)``, ``setattr(self, name, m)``): the candidates for every
#: ``self.<attr>`` the class assigns no other way (:meth:`recheck.lint.index.Index.attribute_classes`)
DYNAMIC_ATTRIBUTE = "*"


class Span(NamedTuple):
    """A source range: 1-based lines and 1-based columns (characters, not bytes).

    The small records here are named tuples: the cache pickles hundreds of thousands.
    """

    line: int
    column: int
    end_line: int
    end_column: int


class Hazard(NamedTuple):
    """One hazard in a function body, reported only if the function is in a region.

    The finding reads ``{what} inside checkpointed region `R` (checkpointed at S); {then}``.
    """

    code: str
    span: Span
    what: str
    then: str
    #: "root": counts only in the region's own function (RC107: callees get internal tensors);
    #: "draw:<rng>" / "seed:<rng>": a draw is deterministic when the region seeds that RNG.
    tag: str = ""


class Ref(NamedTuple):
    """Something a call may run, resolved as far as one file allows.

    ``kind`` is one of:

    - ``"name"``: a module-level function or class, ``name`` its dotted qualified name;
    - ``"local"``: a nested function or lambda of this file, ``name`` its qualname;
    - ``"self"``: ``self.<name>``: a method of the enclosing class or a submodule attribute;
    - ``"elements"``: the modules held by the container ``self.<name>`` (``ModuleList``,
      ``Sequential``), as when a loop variable over ``self.layers`` is called;
    - ``"member"``: method ``member`` of the submodule(s) ``self.<name>``;
    - ``"super"``: method ``name`` of the enclosing class's bases;
    - ``"returned"``: the nested functions that function ``name`` (a ``name``/``local``
      reference in ``member``) returns, as with ``create_custom_forward(layer)``;
    - ``"path"``: the submodule(s) at ``self.<name>`` where ``name`` is a dotted path with
      subscripts dropped (``self.down[i].block[j]`` is ``down.block``, ``self.mid.block_1``
      is ``mid.block_1``);
    - ``"param"``: parameter ``name`` of the enclosing function, ``member`` its position
      among the call's arguments (``"-1"`` keyword-only): resolved from what callers pass;
    - ``"result"``: what method ``self.<name>(...)`` returns (``layer = self._get_layer(i)``);
    - ``"param_path"``: ``name`` is a dotted path from a parameter (``model.layers``), its
      first component the parameter: resolved through the parameter's annotation;
    - ``"children"``: every submodule of ``self`` (``for child in self.named_children()``);
    - ``"instance"``: an instance of class ``name`` (an ``isinstance`` branch, an annotation):
      calling it runs its ``forward``;
    - ``"policy"``: a wrapping policy or ``check_fn`` that picks the classes named in
      ``member`` (comma-separated qualified names), whatever module it is applied to.
    """

    kind: str
    name: str
    span: Span
    member: str = ""


class Deferred:
    """A record whose body facts may be filled in later, on first read.

    :meth:`defer` takes the fields outside ``OUTLINE`` off the instance and keeps a loader;
    reading one of them calls the loader once, which fills them (:meth:`fill`).  Records
    that were never deferred are plain dataclasses: the hook costs nothing on them.
    """

    #: the fields an outline has; every other field is the body's
    OUTLINE: ClassVar[frozenset[str]] = frozenset()
    #: what every record has (the dataclasses below declare them as their first fields)
    qualname: str
    span: Span

    def __getattr__(self, name: str) -> object:  # called only for attributes the instance lacks
        load = self.__dict__.get("_load")
        if load is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        load()
        if "_load" in self.__dict__:
            raise RuntimeError(f"loading the body of {self.__dict__.get('qualname')!r} did not fill it")
        return getattr(self, name)

    def defer(self, load: Callable[[], None]) -> None:
        """Drop the body fields; ``load()`` must :meth:`fill` them when one is read."""
        for name in self._body_fields():
            self.__dict__.pop(name, None)
        self.__dict__["_load"] = load

    def fill(self, other: Deferred) -> None:
        """Take the body fields of ``other`` (the same definition, analysed)."""
        for name in self._body_fields():
            self.__dict__[name] = other.__dict__[name]
        self.__dict__.pop("_load", None)

    @property
    def deferred(self) -> bool:
        return "_load" in self.__dict__

    def stored_values(self) -> list[object]:
        """The field values in declaration order, a deferred field as its default (for the
        cache, which must not load bodies to store an outline)."""
        values = []
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            if item.name in self.__dict__:
                values.append(self.__dict__[item.name])
            elif item.default_factory is not dataclasses.MISSING:
                values.append(item.default_factory())
            else:
                values.append(item.default)
        return values

    @classmethod
    def _body_fields(cls) -> tuple[str, ...]:
        names = cls.__dict__.get("_BODY")
        if names is None:
            names = tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.OUTLINE)  # type: ignore[arg-type]
            cls._BODY = names  # type: ignore[attr-defined]
        return names


@dataclass
class FunctionFacts(Deferred):
    """A function (or lambda) body: its hazards and what it calls."""

    OUTLINE = frozenset({"qualname", "span", "self_class"})

    qualname: str
    span: Span
    self_class: str | None = None  # qualname of the class ``self`` refers to, if any
    hazards: list[Hazard] = field(default_factory=list)
    calls: list[Ref] = field(default_factory=list)
    returns_local: list[str] = field(default_factory=list)
    returns_refs: list[Ref] = field(default_factory=list)  # ``return self.layers[i]``
    memoized: bool = False  # @lru_cache/@cache: the body runs once per arguments, not per call
    #: qualified names called in ``return`` statements: a factory's products (``get_down_block``)
    returns_built: list[str] = field(default_factory=list)
    #: parameter names in call order (``self`` of a method dropped) and their annotations
    params: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    #: ``(first line, last line, parameters)``: an ``if`` body that cannot run when none of
    #: the parameters is passed (see :mod:`recheck.lint.reachability`)
    guards: list[tuple[int, int, tuple[str, ...]]] = field(default_factory=list)
    #: parameters that are None or empty when a caller leaves them out (incl. ``*args``, ``**kwargs``)
    optional: list[str] = field(default_factory=list)
    #: the names of ``*args`` and ``**kwargs`` ("" when absent), and of keyword-only parameters
    star: list[str] = field(default_factory=list)
    keyword_only: list[str] = field(default_factory=list)
    #: attributes of ``self`` this method reads as data (first read of each), and the ones it
    #: rebinds (``self.mask = m``; ``self.layers[i].kv = kv`` as ``layers.kv``): RC101
    self_reads: list[tuple[str, Span]] = field(default_factory=list)
    self_writes: list[str] = field(default_factory=list)
    #: names that are None while the listed parameters are not given (see
    #: :func:`recheck.lint.reachability.none_names`)
    none_if: dict[str, list[str]] = field(default_factory=dict)
    #: for each call in ``calls``: (index of its first ref, number of refs, positional
    #: arguments or -1 with a ``*`` splat, keywords as ``name`` or ``name=passed_name``,
    #: names splatted with ``**``, the call's line, each positional argument's passed name
    #: or ``""``)
    call_passes: list[tuple[int, int, int, tuple[str, ...], tuple[str, ...], int, tuple[str, ...]]] = field(
        default_factory=list)
    #: what ``return`` statements build that is neither a tensor nor a tuple: ``"dict"``,
    #: ``"list"``, or ``"call:<qualified name>"`` of a capitalised callable (a dataclass, a
    #: ``ModelOutput``), each with the returned expression's place (RC110)
    returned: list[tuple[Span, str]] = field(default_factory=list)
    #: the qualified return annotation, ``""`` when there is none
    returns_annotation: str = ""


@dataclass
class ClassFacts(Deferred):
    """A class: bases (qualified), methods and the submodule classes of its attributes."""

    OUTLINE = frozenset({"qualname", "span", "bases", "methods"})

    qualname: str
    span: Span
    bases: list[str] = field(default_factory=list)
    methods: dict[str, str] = field(default_factory=dict)  # name -> function qualname
    attributes: dict[str, list[str]] = field(default_factory=dict)  # attr -> class names
    #: ``self.<attr> = some_function``: attr -> qualnames (in the class's file) of the functions
    function_attributes: dict[str, list[str]] = field(default_factory=dict)
    #: ``self.<attr> = <parameter>`` in ``__init__``: attr -> (parameter, position in a call)
    param_attributes: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: ``NAME = True`` / ``NAME = False`` in the class body (``_can_checkpoint_with_cache``);
    #: ``"@dataclass"``: True when the class is decorated with ``dataclasses.dataclass``
    flags: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class CallSite:
    """A call of a checkpoint entry point."""

    span: Span
    entry: str  # qualified name of the entry point (``torch.utils.checkpoint.checkpoint``)
    caller: str  # qualname of the enclosing function, or ``<module>``
    targets: tuple[Ref, ...]
    use_reentrant: str  # "given", "splat" (may travel in **kwargs) or "missing"
    preserve_rng_false: Span | None = None
    #: ``checkpoint(fn, ...)`` where ``fn`` is a parameter: the caller is a wrapper of ``entry``
    #: and its own callers name the region (position, name of that parameter)
    forwards: tuple[str, int, str] | None = None  # (wrapper function's qualname, position, parameter)
    region_source: str = ""  # the region argument as written, for --statistics and --show-regions
    #: what the call passes to the region: (positional count, keyword names); None if unknown
    passed: tuple[int, tuple[str, ...]] | None = None
    #: the positions in ``passed`` of arguments given as a literal ``None``
    none_positions: tuple[int, ...] = ()
    #: the value ``use_reentrant`` is given when it is a constant (None when absent or unknown)
    reentrant: bool | None = None


@dataclass
class FileFacts:
    """Everything phase one learns about one file."""

    path: str
    module: str
    imports: dict[str, str] = field(default_factory=dict)  # local alias -> qualified name
    classes: dict[str, ClassFacts] = field(default_factory=dict)  # qualname -> facts
    functions: dict[str, FunctionFacts] = field(default_factory=dict)  # qualname -> facts
    call_sites: list[CallSite] = field(default_factory=list)
    #: hazards of the file itself, reported whether or not a region reaches them (RC003)
    file_hazards: list[Hazard] = field(default_factory=list)
    #: ``self.<attr> = <entry point>`` (or a partial of one) in a class: ``"Class.attr"``
    entry_attributes: list[str] = field(default_factory=list)
    #: what rules' function hooks recorded about the modules a function touches (RC111: a forward
    #: hook it adds and removes): ``(function qualname, hazard draft, refs of those modules)``
    hooked: list[tuple[str, Hazard, list[Ref]]] = field(default_factory=list)
    #: top-level definitions whose bodies were not analysed, by name, with the qualnames of
    #: the classes and functions outlined for each (see :class:`Deferred`)
    outlined: dict[str, list[str]] = field(default_factory=dict)
