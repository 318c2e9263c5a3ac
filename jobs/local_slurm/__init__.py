"""A local Slurm on this host and a training job on it: what ``manage.py slurm_demo`` (``make slurm-demo``) runs.

``cluster.SlurmCluster`` starts munged, one slurmctld and several slurmd, each emulating a node; ``training``
submits the demo's training job and kills a node under it. The Slurm tests and benchmarks use the same harness
(their scenarios are in ``tests/support/slurm_scenario.py``). Standard library only; no app is imported.
"""
