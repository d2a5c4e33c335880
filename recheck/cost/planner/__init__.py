"""Choose what to checkpoint within a memory budget, measured and verified: ``recheck cost --suggest``.

Modules, bottom to top: ``plans`` (the plan a user keeps and applies; no torch), ``wrapping``
(:func:`apply_plan`: a module's forward checkpointed, fully or selectively, and undone),
``overlay`` (the step's own checkpoint calls a plan drops, run directly under any
interception), ``candidates`` (the units and regions found by running the step), ``attribution``
and ``census`` (one traced run per mode: windows, holds, work; timed runs), ``memory_model``
(peak and time of any plan, as a 0-1 program), ``solver`` (milp or an exact branch and bound),
``plan_runs`` (a plan traced, timed and verified with ``check_step``; the anchors),
``keeping`` (the line that keeps a plan in the user's code), ``suggestion`` (the outcome, its
report in text and JSON, and the census every suggestion starts from), ``throughput`` and
``suggest`` (:func:`suggest`).  The public names are exported by :mod:`recheck.cost`.
"""
