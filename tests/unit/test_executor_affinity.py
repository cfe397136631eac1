"""Pinning local ranks to disjoint physical cores (executor --cpu-affinity split)."""

import os

import pytest

from meshplan.errors import ConfigError
from meshplan.executor.affinity import (linux_siblings, physical_cores, pin_local_rank,
                                        rank_cpus)


def smt(n_cores: int):
    """Siblings of a host with ``n_cores`` cores of two hyper-threads, numbered i, i+n."""
    return lambda cpu: {cpu % n_cores, cpu % n_cores + n_cores}


def test_the_docstring_example_keeps_hyper_threads_with_their_core():
    cpus = range(8)
    assert physical_cores(cpus, smt(4)) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert rank_cpus(cpus, 0, 2, smt(4)) == (0, 1, 4, 5)
    assert rank_cpus(cpus, 1, 2, smt(4)) == (2, 3, 6, 7)


def test_shares_are_disjoint_cover_every_core_and_differ_by_at_most_one():
    cpus = [c for c in range(64) if c not in (5, 37)]      # one core's pair not allowed
    shares = [rank_cpus(cpus, r, 3, smt(32)) for r in range(3)]
    flat = [c for s in shares for c in s]
    assert sorted(flat) == sorted(cpus) and len(flat) == len(set(flat))
    cores = [len(physical_cores(s, smt(32))) for s in shares]
    assert cores == [11, 10, 10]
    # a sibling outside the allowed set does not pull it in
    assert physical_cores([0, 1], smt(4)) == [(0,), (1,)]


def test_errors_name_the_counts_and_the_way_out():
    with pytest.raises(ConfigError, match=r"1 core\(s\) for 2 ranks; use --cpu-affinity none"):
        rank_cpus([0, 4], 0, 2, smt(4))
    with pytest.raises(ConfigError, match="local rank 3 is not in 0..1"):
        rank_cpus(range(8), 3, 2, smt(4))
    with pytest.raises(ConfigError, match="'spread'.*none, split"):
        pin_local_rank("spread", 0, 1)
    assert pin_local_rank("none", 0, 4) is None


def test_linux_siblings_reads_sysfs_lists(tmp_path):
    d = tmp_path / "cpu3" / "topology"
    d.mkdir(parents=True)
    (d / "thread_siblings_list").write_text("3,35\n")
    assert linux_siblings(3, tmp_path) == {3, 35}
    (d / "thread_siblings_list").write_text("2-3\n")
    assert linux_siblings(3, tmp_path) == {2, 3}
    assert linux_siblings(9, tmp_path) == {9}                  # unknown: itself


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_one_local_rank_keeps_every_allowed_cpu():
    before = os.sched_getaffinity(0)
    try:
        assert set(pin_local_rank("split", 0, 1)) == before
        assert os.sched_getaffinity(0) == before
    finally:
        os.sched_setaffinity(0, before)
