"""The measured layer tables of a calibrated profile, under the names the cost model's modules
import them by.

The tables are profile data: :mod:`meshplan.hardware_profiles.measured` defines them (rows,
shape keys, interpolation by micro-batch and stage depth) and builds them when a profile
loads, below the cost model in the import graph, as :class:`~meshplan.hardware_profiles.curve.Curve`
is for the datasheet curves. Nothing is defined here: no formula and no error of its own
(the rows' use and error: :mod:`meshplan.costmodel.parts`).
"""

from meshplan.hardware_profiles.measured import (ENDS, Interpolated, MeasuredEnd,  # noqa: F401
                                                 MeasuredLayer, MeasuredTables,
                                                 ends_shape_key, layer_shape_key,
                                                 split_backward_at, tables_from_rows,
                                                 wgrad_bytes_at)

__all__ = ["ENDS", "Interpolated", "MeasuredEnd", "MeasuredLayer", "MeasuredTables",
           "ends_shape_key", "layer_shape_key", "split_backward_at", "tables_from_rows",
           "wgrad_bytes_at"]
