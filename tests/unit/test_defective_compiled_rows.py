"""Loading a GPU profile whose compiled tp + SP / ep rows were timed before the executor's
compiled collectives kept their backward (docs/benchmarks/compiled_grads.md) warns, by name;
a profile marked by a fixed calibration, a torch that traced them right, or eager rows only
do not."""
import warnings

import pytest

from meshplan.errors import MeshplanWarning
from meshplan.hardware_profiles.stale_rows import warn_defective_compiled_rows

OLD = {"device": "cuda", "torch": "2.11.0+cu130"}
EP2 = {"compile": True, "tp": 1, "sequence_parallel": False, "ep": 2}
SP = {"compile": True, "tp": 2, "sequence_parallel": True, "ep": 1}


def test_compiled_sp_and_ep_rows_from_an_unmarked_torch_2_11_profile_warn():
    with pytest.warns(MeshplanWarning, match=r"p\.toml: 2 compiled layer row\(s\).*2\.11"):
        warn_defective_compiled_rows(OLD, [EP2, SP, {**EP2, "compile": False}], "p.toml")


@pytest.mark.parametrize("prov, rows", [
    ({**OLD, "compiled_collectives": "functional when traced"}, [EP2, SP]),   # recalibrated
    ({**OLD, "torch": "2.13.0+cpu"}, [EP2, SP]),          # 2.13 traced the old code right
    ({**OLD, "device": "cpu"}, [EP2, SP]),
    (OLD, [{**EP2, "compile": False}, {**SP, "tp": 2, "sequence_parallel": False},
           {**SP, "tp": 1}]),                                 # eager, tp without SP, tp 1
])
def test_no_warning_where_the_rows_are_not_the_defective_kind(prov, rows):
    with warnings.catch_warnings():
        warnings.simplefilter("error", MeshplanWarning)
        warn_defective_compiled_rows(prov, rows, "p.toml")


def test_a_gpu_profile_whose_optimizer_row_is_small_warns_by_name_and_size():
    from meshplan.hardware_profiles.calibrated import _warn_small_optimizer_row
    old = [{"op": "rmsnorm", "elements": 1 << 29}, {"op": "adamw", "elements": 1 << 25}]
    with pytest.warns(MeshplanWarning, match=r"p\.toml: optimizer_gbps .*33,554,432-element"):
        _warn_small_optimizer_row({"device": "cuda"}, old, "p.toml")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MeshplanWarning)
        _warn_small_optimizer_row({"device": "cuda"}, [{"op": "adamw", "elements": 1 << 29}],
                                  "p.toml")
        _warn_small_optimizer_row({"device": "cpu"}, old, "p.toml")     # the CPU's own size
        _warn_small_optimizer_row({"device": "cuda"}, [], "p.toml")     # no row: datasheet
