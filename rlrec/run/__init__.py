"""The process around a run: the entry point (``cli``), the checks that refuse a run before work
(``preflight``, ``budget``), the run dir and its lock (``rundir``), the stop flag and preemption
(``preempt``) and sweeps (``sweep``)."""
