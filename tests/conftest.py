"""Settings for the whole test session.

One OpenMP/MKL thread per process: the tests run many processes at once (2-8 gloo ranks,
torchrun children) on a 2-core machine, where torch's default of a thread per core
oversubscribes the cores, and its spinning threads made single-process CPU benchmarks
15-30 times slower whenever another process was busy (issue 37: the suite took 13.5 min on
the shared 2-core machine). Set before any test module imports torch; children inherit it.

The suite runs on two workers with `python -m pytest -q -n 2 --dist loadfile` (pytest-xdist):
each file runs on one worker, so a module's spawned gloo world and a fixture shared by the
tests of one file start once. Tests are xdist-safe: in-test gloo groups meet through a file
store in their own temporary directory, torchrun --standalone picks its own free port, and
every path written is under the test's tmp_path.
"""

import gc
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# The executor's compiled blocks and loss compile with the graph-only backend: Dynamo,
# AOTAutograd's backward and partition and Inductor's decompositions, without Inductor's C++
# code generation (1.5-2 s of CPU a kernel, most of the suite's time). A few tests keep
# Inductor (Case(compile_backend="inductor")); meshplan.executor.parallelize.compile_backend.
os.environ.setdefault("MESHPLAN_COMPILE_BACKEND", "aot_eager_decomp_partition")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gc_unfrozen: run without the test process's earlier objects frozen "
                   "(tests of the library's own gc.freeze use, meshplan.executor.gc_control)")
    # pytest-xdist (--dist loadfile, the test command of README.md and .ci/run) hands out
    # whole files; by default it orders them by their number of tests, which puts the long
    # single-test files last, where one worker runs them while the other has nothing left.
    # Keep the order below.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    """Files with a `slow` test first, then files that start CPU ranks (`distributed`), then
    the rest, each group in collection order: with two workers, both start on the long files
    and finish on short ones."""
    rank = {}
    for item in items:
        f = item.nodeid.split("::", 1)[0]
        r = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker(
            "distributed") else 2
        rank[f] = min(rank.get(f, 2), r)
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])   # stable


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test (its fixtures' set-up and teardown included) runs with what the test process
    held before it in the collector's permanent generation (``gc.freeze``), as
    tests/_ranks.py does in the ranks: a full collection then walks only the test's own
    objects. Without it every full collection in a worker walks torch, every imported test
    module and the earlier tests' survivors, 0.3-1.4 s each: the calibration's
    ``gc.collect()`` after each module it times, and automatic ones, took about 100 s of
    the suite's CPU, most of it in the calibration tests (2026-12-04: the suite on two
    workers went from 618 to 470 s, nearly all of it this). Frozen objects are never
    collected: only objects older than the test are frozen, and ``gc.unfreeze`` afterwards
    hands them back to the collector (a library ``gc.unfreeze`` inside the test only ends
    the freeze early). Both calls are constant time. Tests of the library's own freezing are
    marked ``gc_unfrozen``."""
    if item.get_closest_marker("gc_unfrozen"):
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
