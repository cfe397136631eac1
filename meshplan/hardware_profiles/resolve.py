"""A cluster from what a user names on the command line or in ``mp.report(cluster=...)``: a
preset name or a cluster TOML file, with a calibrated profile applied if one is given."""

from __future__ import annotations

import os
from pathlib import Path

from meshplan.hardware_profiles.calibrated import apply_profile
from meshplan.hardware_profiles.cluster import Cluster


def load_cluster(text: str, nodes: int | None, profile: str | None = None,
                 override: bool = False) -> Cluster:
    """A preset name (``nodes`` of it), a cluster TOML file, or ``FILE.toml:NAME`` (one
    cluster of a file that holds several); with ``profile``, a calibrated profile applied to
    it (refused if measured on another GPU type unless ``override``)."""
    path, sep, name = text.rpartition(".toml:")
    if sep and name:
        cluster = Cluster.from_toml(Path(path + ".toml"), name=name, nodes=nodes)
    elif text.endswith(".toml") or os.path.sep in text:
        cluster = Cluster.from_toml(Path(text), nodes=nodes)
    else:
        cluster = Cluster.preset(text, nodes=nodes)
    if profile:
        cluster = apply_profile(cluster, Path(profile), override=override)
    return cluster
