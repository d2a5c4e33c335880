"""The cross-file index: qualified names to the classes and functions of the linted tree.

Lookups follow re-exports (``from .modeling_llama import LlamaDecoderLayer`` in a
package ``__init__``) and record the qualified names they could not find, so the engine
can parse the files that define them and try again.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Union

from recheck.lint.facts import DYNAMIC_ATTRIBUTE, ClassFacts, FileFacts, FunctionFacts

__all__ = ["Index", "Symbol"]

Symbol = tuple[FileFacts, Union[ClassFacts, FunctionFacts]]
MAX_HOPS = 8
#: Star imports are followed this deep: each may lead to several modules, and a module not
#: parsed yet reads as its package, whose star imports would lead on without end.
MAX_STAR_HOPS = 2
#: At most this many classes of the tree may assign an attribute for a reference to it through
#: an object of unknown class (``model.double_blocks``, a parameter annotated ``nn.Module``)
#: to resolve by the attribute's name; a name more classes assign says nothing.
MAX_HOLDERS = 3


class Index:
    """Every file's facts, by module name."""

    def __init__(self, files: Iterable[FileFacts], assigners: Mapping[str, set[tuple[str, str]]] | None = None,
                 installed: Iterable[FileFacts] = (), installed_names: Mapping[str, str] | None = None) -> None:
        #: Every file, sorted by path.  Two files may share a module name (scripts in
        #: separate folders): both are linted, and lookups by name find the first.
        self.files: list[FileFacts] = sorted(files, key=lambda f: f.path)
        self.modules: dict[str, FileFacts] = {}
        for facts in self.files:
            self.modules.setdefault(facts.module, facts)
        #: first components of the tree's module names: a name whose first component is
        #: not one may come from a namespace package linted from inside (``megatron/core``
        #: without ``megatron/__init__.py`` gives modules ``core.*``)
        self.roots = {name.split(".", 1)[0] for name in self.modules}
        for facts in installed:  # looked up by name only: never linted, never a region of their own
            self.modules.setdefault(facts.module, facts)
        #: a class outside the tree asked for by :meth:`installed_class` -> its qualified name
        #: where the installed package defines it ("" where it is not installed or not defined)
        self.installed_names: Mapping[str, str] = installed_names if installed_names is not None else {}
        #: classes :meth:`installed_class` was asked about and the engine has not looked for
        self.installed_misses: set[str] = set()
        self.misses: set[str] = set()
        self._found: dict[str, Symbol | None] = {}
        self._bases: dict[int, set[str]] = {}
        self._lineages: dict[int, list[tuple[FileFacts, ClassFacts]]] = {}
        self._methods: dict[tuple[int, str, bool], tuple[FileFacts, FunctionFacts] | None] = {}
        #: attribute name -> (file path, top-level class name) of the classes whose text assigns
        #: ``self.<attribute>`` (the engine's text scan); an attribute not in it is a miss
        self.assigners: Mapping[str, set[tuple[str, str]]] = assigners if assigners is not None else {}
        #: attribute names :meth:`holders` was asked about and the engine has not scanned for:
        #: it may parse the files that assign them, and retry
        self.attribute_misses: set[str] = set()
        self._holders: dict[str, list[tuple[FileFacts, ClassFacts]]] = {}
        self._by_path = {facts.path: facts for facts in self.files}

    def lookup(self, qualified: str, origin: FileFacts | None = None) -> Symbol | None:
        """The class or function named ``package.module.Class[.method]``, if in the tree.

        A name of ``origin``'s own module is looked up in ``origin`` first (another file
        may share its module name).
        """
        if origin is not None and qualified.startswith(origin.module + "."):
            rest = qualified[len(origin.module) + 1:]
            if rest in origin.classes:
                return origin, origin.classes[rest]
            if rest in origin.functions:
                return origin, origin.functions[rest]
        if "." not in qualified and origin is not None:  # a name no import binds: from a star import?
            return next(filter(None, (self.lookup(f"{source}.{qualified}") for source in _starred(origin))), None)
        if qualified not in self._found:
            self._found[qualified] = self._lookup(qualified, 0)
        return self._found[qualified]

    def _lookup(self, qualified: str, hops: int, quiet: bool = False) -> Symbol | None:
        """``quiet``: a guess through a star import, whose miss does not make the engine parse more."""
        parts = qualified.split(".")
        if len(parts) > 2 and parts[0] not in self.roots and parts[1] in self.roots:
            found = self._lookup(".".join(parts[1:]), hops + 1, quiet)
            if found is not None:
                return found
        for cut in range(len(parts) - 1, 0, -1):
            facts = self.modules.get(".".join(parts[:cut]))
            if facts is None:
                continue
            rest = ".".join(parts[cut:])
            if rest in facts.classes:
                return facts, facts.classes[rest]
            if rest in facts.functions:
                return facts, facts.functions[rest]
            head = parts[cut]
            if head in facts.imports and hops < MAX_HOPS:
                return self._lookup(".".join([facts.imports[head], *parts[cut + 1:]]), hops + 1, quiet)
            for source in _starred(facts) if hops < MAX_STAR_HOPS else ():
                name = ".".join([source, *parts[cut:]])
                if name not in self._found:  # each name searched once: star imports may import each other
                    self._found[name] = None
                    self._found[name] = self._lookup(name, hops + 1, True)
                if self._found[name] is not None:
                    return self._found[name]
            break
        if not quiet:
            self.misses.add(qualified)  # the engine may parse the file that defines it, and retry
        return None

    def lookup_class(self, qualified: str, origin: FileFacts | None = None) -> tuple[FileFacts, ClassFacts] | None:
        found = self.lookup(qualified, origin)
        return found if found and isinstance(found[1], ClassFacts) else None  # type: ignore[return-value]

    def installed_class(self, qualified: str) -> tuple[FileFacts, ClassFacts] | None:
        """The class ``qualified`` of a package outside the tree, as the installed package's
        source defines it (read by the engine, never imported); None until it has been read,
        or where it is not installed.  A name of the tree's own packages is never looked for."""
        if qualified.split(".", 1)[0] in self.roots:
            return None
        if qualified not in self.installed_names:
            self.installed_misses.add(qualified)  # the engine may read the file that defines it, and retry
            return None
        defined = self.installed_names[qualified]
        return self.lookup_class(defined) if defined else None

    def lineage(self, facts: FileFacts, cls: ClassFacts) -> list[tuple[FileFacts, ClassFacts]]:
        """The class and its bases found in the tree, depth-first (an approximate MRO)."""
        if id(cls) not in self._lineages:
            self._lineages[id(cls)] = list(self._lineage(facts, cls))
        return self._lineages[id(cls)]

    def _lineage(self, facts: FileFacts, cls: ClassFacts) -> Iterator[tuple[FileFacts, ClassFacts]]:
        seen: set[int] = set()
        stack = [(facts, cls)]
        while stack:
            file, klass = stack.pop()
            if id(klass) in seen:
                continue
            seen.add(id(klass))
            yield file, klass
            for base in reversed(klass.bases):
                found = self.lookup_class(base)
                if found:
                    stack.append(found)

    def base_names(self, facts: FileFacts, cls: ClassFacts) -> set[str]:
        """The qualified names of every base, transitively, found in the tree or not."""
        if id(cls) not in self._bases:
            self._bases[id(cls)] = {base for _, klass in self.lineage(facts, cls) for base in klass.bases}
        return self._bases[id(cls)]

    def find_method(self, facts: FileFacts, cls: ClassFacts, name: str, skip_self: bool = False) -> tuple[FileFacts, FunctionFacts] | None:
        """The method ``name`` as the class sees it (``skip_self``: as ``super()`` sees it)."""
        key = (id(cls), name, skip_self)
        if key not in self._methods:
            self._methods[key] = self._find_method(facts, cls, name, skip_self)
        return self._methods[key]

    def _find_method(self, facts: FileFacts, cls: ClassFacts, name: str, skip_self: bool) -> tuple[FileFacts, FunctionFacts] | None:
        for file, klass in self.lineage(facts, cls):
            if skip_self and klass is cls:
                continue
            qualname = klass.methods.get(name)
            if qualname and qualname in file.functions:
                return file, file.functions[qualname]
        return None

    def attribute_classes(self, facts: FileFacts, cls: ClassFacts, attribute: str) -> list[str]:
        """The module classes of ``self.<attribute>``; for one the class never assigns, the
        modules it adds by a name computed at run time (``self.add_module(*stage)``), if any."""
        lineage = self.lineage(facts, cls)
        for _, klass in lineage:
            if attribute in klass.attributes:
                return klass.attributes[attribute]
        for _, klass in lineage:
            if DYNAMIC_ATTRIBUTE in klass.attributes and "." not in attribute:
                return klass.attributes[DYNAMIC_ATTRIBUTE]
        return []

    def holders(self, attribute: str) -> list[tuple[FileFacts, ClassFacts]]:
        """The classes of the tree that assign a module of the tree to ``self.<attribute>``, when
        at most :data:`MAX_HOLDERS` do (else ``[]``): what an object of unknown class whose
        ``attribute`` is read can be."""
        if attribute not in self.assigners:
            self.attribute_misses.add(attribute)
            return []
        if attribute not in self._holders:
            found = []
            for path, name in sorted(self.assigners[attribute]):
                file = self._by_path.get(path)
                cls = file.classes.get(name) if file is not None else None
                if file is not None and cls is not None and any(
                        self.lookup_class(q, file) is not None for q in cls.attributes.get(attribute, ())):
                    found.append((file, cls))
            self._holders[attribute] = found if len(found) <= MAX_HOLDERS else []
        return self._holders[attribute]


def _starred(facts: FileFacts) -> list[str]:
    """The modules a file imports everything from (``from .blocks import *``)."""
    return [source for alias, source in facts.imports.items() if alias[:1] == "*"]
