"""What a rule is to the linter: an object with hooks that the engine calls (Fixit's ``LintRule``).

The linter works in two phases (see :mod:`recheck.lint.facts`), and a rule may hook into
either.  Phase one reads one file at a time (its results are cached); its hooks return
:class:`~recheck.lint.facts.Hazard` records that count only where phase two finds them
reached:

* :meth:`Rule.visit`, the *body hook*: one AST node of a function body, for the node types
  in ``NODES``; its hazards belong to that function;
* :meth:`Rule.visit_class`, the *class hook*: a class definition, for hazards of the file
  itself (reported wherever the class is) or of one of the class's methods;
* :meth:`Rule.visit_function`, the *function hook*: a function's own nodes, for hazards that
  count where a module the function touches runs in a region (recorded with the references
  of those modules, judged by :meth:`Rule.tree`).

Phase two joins the files, finds the regions, walks each one and calls, per region:

* :meth:`Rule.outside_call` for each call of a module class defined outside the linted tree;
* :meth:`Rule.region`, the *whole-region hook*, for hazards judged on the region as a whole;
* :meth:`Rule.settle`, which may drop the region's hazards that the region as a whole makes
  harmless (a stack pushed and popped, an RNG reseeded first);

then :meth:`Rule.site`, the *call-site hook*, once per checkpoint call with the regions it
names, and :meth:`Rule.tree` once with every region.  What a hook may read is its arguments:
the facts it needs are declared by its signature, and the phase-two views
(:class:`RegionView`, :class:`TreeView`) say what each fact is.

A rule module ``rc<NNN>_<name>.py`` in this package defines one subclass of :class:`Rule` and
its ``CODE``; the package finds it by its file name, so adding a rule is its module and its
document in ``rules/`` (``RC<NNN>-<name>.md``), nothing else.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, ClassVar, Iterable, Iterator

from recheck.lint.facts import CallSite, FileFacts, FunctionFacts, Hazard, Ref
from recheck.lint.scope import FunctionContext

if TYPE_CHECKING:
    from recheck.lint.index import Index
    from recheck.lint.regions import Region

__all__ = ["HookedHazard", "RegionHit", "RegionView", "Rule", "TreeView"]

#: a hazard placed in a file: ``(path, hazard)``
RegionHit = tuple[str, Hazard]
#: what a function hook records: a hazard draft and the modules whose running in a region makes it count
HookedHazard = tuple[Hazard, list[Ref]]


class RegionView:
    """One region as phase two sees it, for :meth:`Rule.region`, :meth:`Rule.settle` and
    :meth:`Rule.site`."""

    __slots__ = ("hits", "index", "name", "reached", "reentrant", "region")

    def __init__(self, index: Index, region: Region, reached: list[tuple[FileFacts, FunctionFacts]],
                 reentrant: bool | None, hits: list[RegionHit]) -> None:
        #: the whole tree's facts (classes' lineage, methods, attributes)
        self.index = index
        #: the region: ``name``, ``origin`` ("checkpointed at model.py:88"), root ``file`` and ``function``
        self.region = region
        self.name = region.name
        #: every function the region runs, with its file (the root first)
        self.reached = reached
        #: whether the checkpoint call runs the reentrant implementation (None: unknown, or no call)
        self.reentrant = reentrant
        #: the hazards the region reached, every rule's, as ``(path, hazard)`` (:meth:`Rule.site`
        #: sees them before :meth:`Rule.settle`)
        self.hits = hits

    def class_info(self, qualified: str) -> tuple[bool, list[str]] | None:
        """``(is a dataclass, base names)`` of a class of the tree, seen from the region's root file."""
        found = self.index.lookup_class(qualified, self.region.file)
        if found is None:
            return None
        return bool(found[1].flags.get("@dataclass")), sorted(self.index.base_names(found[0], found[1]))


class TreeView:
    """Every region of the tree, for :meth:`Rule.tree` (the engine implements it)."""

    def hooked(self, code: str) -> Iterator[tuple[FileFacts, FunctionFacts, Hazard, list[Ref]]]:
        """The drafts rule ``code``'s function hook recorded, with the function that recorded each."""
        raise NotImplementedError

    def targets(self, ref: Ref, file: FileFacts, function: FunctionFacts) -> Iterator[tuple[FileFacts, FunctionFacts]]:
        """The functions a module reference of ``function`` runs when called (a class's ``forward``)."""
        raise NotImplementedError

    def running(self, file: FileFacts, function: FunctionFacts) -> Region | None:
        """The first region that runs ``function``, None when none does."""
        raise NotImplementedError

    def reaching(self, file: FileFacts, function: FunctionFacts) -> Region | None:
        """A region that calling ``function`` runs: one it calls, or one a checkpoint call in it names."""
        raise NotImplementedError


class Rule:
    """A lint rule: its code, the hooks it implements and the node types its body hook reads.

    Every hook's default does nothing, so a rule overrides only the hooks it needs; the engine
    calls a phase-two hook only on the rules that override it."""

    CODE: ClassVar[str] = ""
    #: the node types :meth:`visit` is called for
    NODES: ClassVar[tuple[type[ast.AST], ...]] = ()
    #: one hazard per message and function (the first), not one per node
    ONCE_PER_FUNCTION: ClassVar[bool] = False
    #: hazards dropped when they sit in a branch none of the region's calls can take (a side
    #: effect under ``if cache is not None:`` when the checkpointing passes no cache)
    BRANCH_SENSITIVE: ClassVar[bool] = False
    #: a regular expression: a file whose text matches may hold this rule's hazards without a
    #: checkpoint call in it (the class and function hooks judge code no region contains)
    FILE_TEXT: ClassVar[str] = ""
    #: fragments of a top-level definition's text that make phase one read its body at once
    UNIT_WORDS: ClassVar[tuple[str, ...]] = ()
    #: :meth:`visit_function` only for functions that make a checkpoint call
    SITES_ONLY: ClassVar[bool] = False

    # -- phase one: one file -------------------------------------------------------------------

    def visit(self, node: ast.AST, ctx: FunctionContext) -> Iterable[Hazard]:
        """Body hook: hazards of one node (of a type in ``NODES``) of a function body."""
        return ()

    def visit_class(self, node: ast.ClassDef, bases: list[str], ctx: FunctionContext) -> Iterable[tuple[str | None, Hazard]]:
        """Class hook: ``(None, hazard)`` for a hazard of the file, reported whether or not a
        region reaches it; ``(method, hazard)`` for one that counts where a region runs that method."""
        return ()

    def visit_function(self, nodes: list[ast.AST], ctx: FunctionContext, owner: str | None) -> Iterable[HookedHazard]:
        """Function hook: hazard drafts about modules this function touches (``owner``: the
        class ``self`` is), judged by :meth:`tree`."""
        return ()

    # -- phase two: the tree -------------------------------------------------------------------

    def outside_call(self, qualified: str, ref: Ref) -> Iterable[Hazard]:
        """Hazards of a region's call of ``ref``, an instance of ``qualified``, a module class
        defined outside the linted tree."""
        return ()

    def region(self, view: RegionView) -> Iterable[RegionHit]:
        """Whole-region hook: hazards judged on the region as a whole."""
        return ()

    def settle(self, hits: list[RegionHit], view: RegionView) -> list[RegionHit]:
        """The region's hazards (every rule's) less those this rule knows the region makes harmless."""
        return hits

    def site(self, site: CallSite, regions: list[RegionView]) -> Iterable[tuple[str | None, Hazard]]:
        """Call-site hook: ``(region name, hazard)`` for a checkpoint call, given the regions it names."""
        return ()

    def tree(self, view: TreeView) -> Iterable[tuple[str, Hazard, str]]:
        """Hazards judged on every region at once, as ``(path, hazard, region name)``."""
        return ()

    @classmethod
    def overrides(cls, hook: str) -> bool:
        """Whether this rule implements ``hook`` (the engine calls only those)."""
        return getattr(cls, hook) is not getattr(Rule, hook)

