"""Pipelines (``torch.distributed.pipelining``): what checkpointing saves per stage and microbatch.

Modules, bottom to top: ``schedules`` (orders of forward/backward per stage, theoretical bundle
counts, the retained-peak model; no torch), ``bundles`` (saved state attributed to a stage and
microbatch), ``windows`` (memory rises per stage window), ``stages`` (a real schedule step
traced on each rank: ``recheck cost --ranks``), ``plan`` (one microbatch in one process, laid
out along a schedule: ``recheck cost --plan``), ``stage_table`` (rendering).
"""
