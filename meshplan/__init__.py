"""meshplan: plan, predict and run data × pipeline × tensor parallel transformer training.

    import meshplan as mp
    est = mp.estimate(mp.ModelSpec.preset("gpt3-175b"),
                      mp.Cluster.preset("dgx-a100-80gb", nodes=128),
                      mp.Job(global_batch=1536, seq_len=2048),
                      mp.Layout(dp=8, pp=16, tp=8, schedule="interleaved-1f1b", vpp=2,
                                recompute="full", zero=1))

Importing meshplan never imports torch (the executor does, on demand) and never imports
ortools (the planner's solver does, when it runs).
"""

from meshplan.spec import Job, Layout, ModelSpec
from meshplan.errors import (ConfigError, ExecutorError, MeshplanError, MeshplanWarning,
                             NoFeasiblePlan, PlanFileError, ProfileError, UnknownPresetError)
from meshplan.hardware_profiles import Cluster, GPUSpec
from meshplan._version import __version__


def __getattr__(name):  # lazy: keeps `import meshplan` light
    if name in ("estimate", "Estimate"):
        from meshplan import costmodel
        return getattr(costmodel, name)
    if name in ("plan", "Plan", "Candidate"):
        from meshplan import planner
        return getattr(planner, name)
    if name == "report":
        from meshplan.report import report
        return report
    raise AttributeError(f"module 'meshplan' has no attribute {name!r}")


__all__ = ["plan", "estimate", "report", "ModelSpec", "Cluster", "GPUSpec", "Job", "Layout",
           "Plan", "Estimate", "MeshplanError", "ConfigError", "NoFeasiblePlan",
           "PlanFileError", "ProfileError", "UnknownPresetError", "ExecutorError",
           "MeshplanWarning"]
