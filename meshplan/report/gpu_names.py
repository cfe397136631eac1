"""Short GPU names for ``--compare-gpus`` (``a100-80gb,h100,h200``) and the clusters they mean."""

from __future__ import annotations

from meshplan.errors import ConfigError, unknown_name_error

# short name -> cluster preset of meshplan/hardware_profiles/data/clusters.toml
GPU_CLUSTERS = {
    "v100": "dgx2h-v100",
    "a100-40gb": "dgx-a100-40gb",
    "a100-80gb": "dgx-a100-80gb",
    "a100": "dgx-a100-80gb",
    "h100": "dgx-h100",
    "h200": "dgx-h200",
    "b200": "dgx-b200",
}


def cluster_preset_for(name: str) -> str:
    """The cluster preset a short GPU name (or a cluster preset name itself) stands for."""
    from meshplan.hardware_profiles import Cluster
    key = name.strip().lower()
    if not key:
        raise ConfigError("an empty GPU name was given; use short names like "
                          f"{', '.join(sorted(GPU_CLUSTERS))}")
    if key in GPU_CLUSTERS:
        return GPU_CLUSTERS[key]
    presets = Cluster.preset_names()
    if key in presets:
        return key
    raise unknown_name_error("GPU", name, list(GPU_CLUSTERS) + presets)


def parse_gpu_list(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"a100-80gb,h100"`` (or a list) -> cluster preset names, in order, without repeats."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in items:
        preset = cluster_preset_for(item)
        if preset not in out:
            out.append(preset)
    return tuple(out)
