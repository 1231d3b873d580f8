"""Worker functions for the launcher tests of tests/test_profile.py. A module of its own that imports
nothing heavy, so that spawned children start in well under a second (they import it by name)."""

import time


def raise_on_rank_1(rank, q):
    if rank == 1:
        raise ValueError("rank one cannot go on")
    time.sleep(60)


def hang_on_rank_1(rank, q):
    if rank == 0:
        q.put(("step", "rank 0 waiting"))
    time.sleep(0 if rank == 0 else 60)
