"""Trial budgets of an Optuna study: how many trials by default, and the share kept for the polish sweep."""

from __future__ import annotations

POLISH_FRACTION = 0.2
"""Share of a single-objective study's new trials kept for the polish sweep around the best plans (``_polish``)."""


def default_budget(n_valid: int) -> int:
    """Trials of an Optuna search: 10% of the valid plans, at least 50."""
    return max(50, n_valid // 10)


def polish_budget(n_trials: int, objectives: tuple[str, ...]) -> int:
    """Trials of the polish sweep among ``n_trials`` new ones (none for a multi-objective study, whose front
    has no single best plan to sweep around)."""
    return int(round(n_trials * POLISH_FRACTION)) if len(objectives) == 1 else 0
