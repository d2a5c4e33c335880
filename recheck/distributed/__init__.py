"""torch.distributed support shared by ``watch()`` and the cost report.

Modules: ``world`` (this process's rank and world size, without initialising anything),
``launch`` (run a function on N local ranks joined in one gloo process group, with a
timeout and cleanup; used by ``recheck cost --ranks`` and the multi-process tests),
``reports`` (every rank's report merged on one rank; per-rank report file names).
Importing this package imports neither torch nor torch.distributed.
"""
