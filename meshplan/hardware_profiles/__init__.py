"""GPU and cluster specs: TOML data files, their loader and the cluster's network graph."""

from meshplan.hardware_profiles.cluster import Cluster, NetworkSpec
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.gpu import GPUSpec
from meshplan.hardware_profiles.loader import builtin_gpu, builtin_gpu_names
from meshplan.hardware_profiles.topology import GroupLink

__all__ = ["Cluster", "NetworkSpec", "Curve", "GPUSpec", "GroupLink", "builtin_gpu",
           "builtin_gpu_names"]
