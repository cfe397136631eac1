"""The environment meshplan gives the processes it starts: multicast off, and torch's CUDA
allocator with expandable segments unless the user chose a setting."""

import os

from meshplan.executor.child_env import (DEFAULT_ALLOCATOR_CONF, NO_MULTICAST_ENV,
                                         allocator_setting, child_env)


def test_allocator_gets_expandable_segments_when_unset():
    env = {"PATH": "/bin"}
    assert allocator_setting(env) == {"PYTORCH_CUDA_ALLOC_CONF": DEFAULT_ALLOCATOR_CONF}
    assert env == {"PATH": "/bin", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_allocator_keeps_the_users_setting_under_either_name():
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    assert allocator_setting(mine) == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    newer = {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}
    assert allocator_setting(newer) == {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}
    assert "PYTORCH_CUDA_ALLOC_CONF" not in newer


def test_an_empty_setting_counts_as_unset():
    env = {"PYTORCH_CUDA_ALLOC_CONF": ""}
    assert allocator_setting(env) == {"PYTORCH_CUDA_ALLOC_CONF": DEFAULT_ALLOCATOR_CONF}


def test_child_env_has_multicast_off_and_the_allocator_default(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = child_env(EXTRA="x")
    assert all(env[k] == v for k, v in NO_MULTICAST_ENV.items())
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == DEFAULT_ALLOCATOR_CONF
    assert env["EXTRA"] == "x"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ   # this process is left alone


def test_child_env_extra_wins(monkeypatch):
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8")
    assert child_env()["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.8"
    assert child_env(PYTORCH_CUDA_ALLOC_CONF="x")["PYTORCH_CUDA_ALLOC_CONF"] == "x"
