"""Calibration: microbenchmarks of what the executor runs, written as a hardware profile,
and the validate driver that compares predictions with measured runs.

Only the ``bench_*`` modules and :mod:`meshplan.calibrate.run` import torch (on demand);
nothing here imports ortools, so calibration and validation run on GPU machines that have
torch but not the planner's solver.
"""
