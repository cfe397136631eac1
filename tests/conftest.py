"""Settings for the whole test session.

One OpenMP/MKL thread per process: the tests run many processes at once (2-8 gloo ranks,
torchrun children) on a 2-core machine, where torch's default of a thread per core
oversubscribes the cores, and its spinning threads made single-process CPU benchmarks
15-30 times slower whenever another process was busy (issue 37: the suite took 13.5 min on
the shared 2-core machine). Set before any test module imports torch; children inherit it.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
