"""RC108: a checkpointed region calls a clock, a UUID, the OS entropy source or a memory query.

Each returns another value when the recomputation calls it again in backward.  A memory query
(``torch.cuda.mem_get_info``, ``memory_allocated``) is the worst of them: backward runs with
other tensors alive than the forward did, so a region that sizes its chunks or picks its
branch by free memory recomputes with another chunk count or branch.
"""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import Rule
from recheck.lint.scope import FunctionContext

CODE = "RC108"
SOURCES = {
    **dict.fromkeys(("time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns", "time.monotonic",
                     "time.monotonic_ns", "time.process_time", "time.process_time_ns", "time.thread_time"),
                    "reads a clock"),
    **dict.fromkeys(("datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today",
                     "datetime.date.today", "datetime.now", "datetime.utcnow"), "reads the date and time"),
    **dict.fromkeys(("uuid.uuid1", "uuid.uuid4"), "makes a new UUID"),
    **dict.fromkeys(("os.urandom", "os.getrandom", "random.SystemRandom"), "reads the OS entropy source"),
    "psutil.virtual_memory": "reads the free host memory",
}
#: torch's memory queries, by last name, on any device module (``torch.cuda``, ``torch.xpu``, ``torch.mps``)
MEMORY_QUERIES = frozenset({"mem_get_info", "memory_allocated", "memory_reserved", "max_memory_allocated",
                            "max_memory_reserved", "memory_cached", "memory_stats", "current_allocated_memory",
                            "driver_allocated_memory"})


class NondeterministicCall(Rule):
    CODE = CODE
    NODES = (ast.Call,)
    ONCE_PER_FUNCTION = True  # one finding per message and function, at the first

    def visit(self, node: ast.Call, ctx: FunctionContext) -> Iterator[Hazard]:  # type: ignore[override]
        qualified = ctx.qualify(node.func) or ""
        what = SOURCES.get(qualified)
        if what is None and qualified.startswith("secrets.") and qualified.count(".") == 1:
            what = "draws from `secrets`"
        elif what is None and qualified.startswith("torch.") and qualified.rsplit(".", 1)[-1] in MEMORY_QUERIES:
            what = "reads the device memory in use or free, which differs in backward"
        if what:
            yield Hazard(CODE, ctx.span(node), f"`{ctx.source(node.func)}()` {what}",
                         "recomputation gets another value; if it reaches a tensor or a branch, it computes something else")


TABLE = "body"
# -- cases: region bodies, run by tests/lint/test_rule_tables.py inside a checkpointed ``Block.forward``
# (its harness defines the names they use); INVALID gives (line, column, part of the message) per finding
INVALID = [
    ("return x * time.perf_counter()", [(1, 20, "`time.perf_counter()` reads a clock")]),
    ("t = time.perf_counter()\nreturn x * (time.perf_counter() - t)", [(1, 13, "`time.perf_counter()` reads a clock")]),
    ("seed = int.from_bytes(os.urandom(4), 'little')\nreturn x + seed",
     [(1, 31, "`os.urandom()` reads the OS entropy source")]),
    ("tag = uuid.uuid4()\nreturn x", [(1, 15, "`uuid.uuid4()` makes a new UUID")]),
    ("now = datetime.datetime.now()\nreturn x", [(1, 15, "`datetime.datetime.now()` reads the date and time")]),
    ("k = secrets.randbelow(4)\nreturn x * k", [(1, 13, "`secrets.randbelow()` draws from `secrets`")]),
    # a chunk count from free memory: backward holds other tensors, so the recomputation chunks otherwise
    ("free, total = torch.cuda.mem_get_info()\nchunks = max(1, x.numel() * 4 * 8 // free)\n"
     "return torch.cat([self.lin(c) for c in x.chunk(chunks)])",
     [(1, 23, "`torch.cuda.mem_get_info()` reads the device memory in use or free")]),
    ("if torch.cuda.memory_allocated() > 2**30:\n    return self.lin(x.half()).float()\nreturn self.lin(x)",
     [(1, 12, "`torch.cuda.memory_allocated()` reads the device memory in use or free")]),
]
VALID = [
    "tag = uuid.uuid5(uuid.NAMESPACE_DNS, 'a')\nreturn x",  # a name-based UUID is the same every time
    "return x * torch.rand_like(x)",
    "if torch.cuda.device_count() > 1:\n    return self.lin(x)\nreturn x",  # fixed for the run
]
