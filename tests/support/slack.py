"""How much longer than on a quiet machine the tests wait for what they wait on.

Every wait in tests/support (``processes.wait_for``, ``slurm_scenario._until``, the servers' readiness checks)
returns as soon as what it waits for happens; its deadline, the figure each call names times ``SLACK``, only
bounds a failure. The figures were each step's time on a quiet two-core machine with room to spare; the whole
suite in parallel beside a CPU burner (load 10–20) makes process starts, torch's steps and a loaded uvicorn's
answers several times slower, and the first burner run failed seven tests on deadlines alone (docs/benchmarks.md,
"The suite under load").
"""

SLACK = 3.0
