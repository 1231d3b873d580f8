"""A torchrun worker for the kill / resume tests: executor.train with a fault injected after each step.

KILL_ENV ("RANK:STEP") makes that rank SIGKILL itself once STEP is recorded and checkpointed; other ranks,
and every rank without it, train as executor.train does. Passed to ``executor.launch.launch(worker=...)``.
"""

import os
import signal
import sys

KILL_ENV = "PLAN_EXECUTOR_KILL"
HERE = os.path.abspath(__file__)


def kill_after(spec: str | None, rank: int):
    """The after-step hook for ``spec`` ("RANK:STEP") on ``rank``: None when it asks nothing of this rank."""
    if not spec:
        return None
    kill_rank, kill_step = (int(x) for x in spec.split(":"))
    if rank != kill_rank:
        return None

    def hook(step: int) -> None:
        if step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


if __name__ == "__main__":
    from executor.train import main

    sys.exit(main(sys.argv[1:], after_step=kill_after(os.environ.get(KILL_ENV), int(os.environ["RANK"]))))
