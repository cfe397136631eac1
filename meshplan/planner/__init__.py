"""Layout search: the space, bounds, the CP-SAT model, the exhaustive reference and ``Plan``.

Importing this package imports neither ortools (only :func:`meshplan.planner.cpsat.solve`
does, when it runs) nor torch, so plan files can be read on GPU machines without ortools.
"""

from meshplan.planner.constraints import OBJECTIVES, Constraints
from meshplan.planner.plan import Candidate, Plan, plan

__all__ = ["plan", "Plan", "Candidate", "Constraints", "OBJECTIVES"]
