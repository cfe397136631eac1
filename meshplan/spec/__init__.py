"""The types every other package speaks: what is trained (:class:`ModelSpec`), how much of it
per step (:class:`Job`) and how it is cut over GPUs (:class:`Layout`), with their validation.

This package sits at the bottom of the import graph (it imports only :mod:`meshplan.errors`),
so the planner, executor, calibration and reports take their types from here rather than from
the cost model.
"""

from meshplan.spec.choices import (ACTIVATIONS, CP_STYLES, FP8_RECIPES, NORMS, OPTIMIZERS,
                                   POSITIONS, PRECISIONS, RECOMPUTE, ROUTERS, RUNTIMES,
                                   SCHEDULES)
from meshplan.spec.job import Job
from meshplan.spec.layout import Layout, default_stage_layers, embedding_loss_stage_layers
from meshplan.spec.model import ModelSpec
from meshplan.spec.validate import ZB_ZERO3_UNSUPPORTED, check_layout, zero_bubble_under_zero3

__all__ = ["ModelSpec", "Job", "Layout", "default_stage_layers", "embedding_loss_stage_layers",
           "check_layout", "zero_bubble_under_zero3", "ZB_ZERO3_UNSUPPORTED", "ACTIVATIONS", "NORMS", "POSITIONS",
           "SCHEDULES", "RECOMPUTE", "PRECISIONS", "OPTIMIZERS", "RUNTIMES", "CP_STYLES",
           "ROUTERS", "FP8_RECIPES"]
