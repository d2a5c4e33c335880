"""Pipelines (``torch.distributed.pipelining``): what checkpointing saves per stage and microbatch.
"""
