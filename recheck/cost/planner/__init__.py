"""Choose what to checkpoint within a memory budget, measured and verified: ``recheck cost --suggest``.

The public names are exported by :mod:`recheck.cost`.
"""
