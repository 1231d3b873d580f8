"""Megatron launch arguments of a pipeline stage split: the layout string and the uneven-split flags.

The split itself is solved in costmodel/split.py (``best_split``, ``min_max_split``); this module
translates one to and from what Megatron is launched with: :func:`megatron_layout` /
:func:`parse_megatron_layout` / :func:`uneven_flags`.

Megatron sources (github.com/NVIDIA/Megatron-LM):

* ``megatron/core/transformer/pipeline_parallel_layer_layout.py``,
  ``PipelineParallelLayerLayout.parse_str_to_list`` / ``__init__`` / ``validate_layer_layout``:
  the ``--pipeline-model-parallel-layout`` string. Virtual stages are separated by ``|``; each holds
  ``E`` (embedding), ``t`` (transformer layer), ``m`` (MTP layer), ``L`` (loss); commas are
  cosmetic; ``x*n`` repeats one character and ``(...)*n`` a group. The string lists pp*vpp
  virtual stages in layer order: entry ``k = vpp_rank * pp + pp_rank``. ``E`` must open the first
  virtual stage and ``L`` close the last one, each exactly once.
* ``megatron/core/transformer/transformer_config.py`` ``TransformerConfig.__post_init__`` (uneven
  PP) and ``megatron/training/arguments.py``: ``--decoder-first-pipeline-num-layers`` /
  ``--decoder-last-pipeline-num-layers`` must be > 0 and divisible by vpp, and the remaining layers
  are split evenly over the middle stages (which must divide them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "megatron_layout",
    "parse_megatron_layout",
    "uneven_flags",
]


# Megatron launch arguments ----------------------------------------------------------------------


def _check_split(layers_per_stage: Sequence[int], vpp: int, multiples: bool = True) -> tuple[int, ...]:
    lps = tuple(int(x) for x in layers_per_stage)
    if not lps:
        raise ValueError("layers_per_stage is empty")
    if vpp < 1:
        raise ValueError(f"vpp={vpp} must be >= 1")
    if any(x < 0 for x in lps):
        raise ValueError(f"layers_per_stage={lps} has negative counts")
    bad = [i for i, x in enumerate(lps) if x % vpp] if multiples else []
    if bad:
        raise ValueError(f"layers_per_stage={lps}: stages {bad} are not multiples of vpp={vpp}")
    return lps


def megatron_layout(layers_per_stage: Sequence[int], vpp: int = 1, *, compact: bool = True, mtp: int = 0) -> str:
    """megatron-core's ``--pipeline-model-parallel-layout`` string for a split.

    Each pipeline rank's layers are divided over its ``vpp`` model chunks as evenly as possible (later
    chunks take the remainder; megatron-core's layout allows unequal virtual stages); the string lists
    the pp*vpp virtual stages in layer order (chunk v of rank r is entry v*pp + r), ``E`` opening
    the first and ``mtp`` MTP modules ``m`` and ``L`` closing the last. With ``compact``, a stage's layers are written ``t*n``
    and runs of equal stages ``(...|)*k``; otherwise every layer is one ``t``. Quote it for a shell.

    >>> megatron_layout((7, 8, 8, 7))
    'Et*7|t*8|t*8|t*7L'
    >>> megatron_layout((2, 4), vpp=2)
    'Et|t*2|t|t*2L'
    """
    lps = _check_split(layers_per_stage, vpp, multiples=False)
    pp = len(lps)
    total = pp * vpp
    stages = []
    for k in range(total):
        v, r = divmod(k, pp)
        base, rem = divmod(lps[r], vpp)
        n = base + (1 if v >= vpp - rem else 0)
        body = "t" * n if not compact or n < 2 else f"t*{n}"
        stages.append(("E" if k == 0 else "") + body + ("m" * mtp + "L" if k == total - 1 else ""))
    if not compact:
        return "|".join(stages)
    runs: list[list] = []
    for s in stages:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    parts: list[str] = []
    for i, (s, c) in enumerate(runs):
        last = i == len(runs) - 1
        reps = c - 1 if last else c            # the final stage is written without a trailing '|'
        if reps >= 3:
            parts.append(f"({s}|)*{reps},")
        else:
            parts.append(f"{s}|" * reps)
        if last:
            parts.append(s)
    return "".join(parts).rstrip(",")


_LAYOUT_CHARS = set("ELtm")


def parse_megatron_layout(s: str, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """Transformer layers per pipeline rank of a ``--pipeline-model-parallel-layout`` string.

    Parsed as megatron-core's ``PipelineParallelLayerLayout.parse_str_to_list`` does (commas
    dropped, ``(...)*n`` then ``x*n`` unrolled, ``|`` between virtual stages), then checked like
    ``__init__`` / ``validate_layer_layout``: pp*vpp virtual stages, ``E`` first and ``L`` last,
    each exactly once. Rank r holds virtual stages r, r+pp, ..., r+(vpp-1)*pp; its chunks may hold
    different numbers of layers (only their total is returned). ``m`` (MTP) layers are not counted.
    """
    text = s.strip().replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    stages = text.split("|")
    bad = sorted({ch for ch in text if ch not in _LAYOUT_CHARS | {"|"}})
    if bad:
        raise ValueError(f"layout {s!r} has invalid characters {bad}; valid: E, L, t, m, |")
    if len(stages) != pp * vpp:
        raise ValueError(
            f"layout {s!r} has {len(stages)} virtual stages but pp={pp} * vpp={vpp} = {pp * vpp}"
        )
    flat = text.replace("|", "")
    if flat.count("E") != 1 or not flat.startswith("E"):
        raise ValueError(f"layout {s!r}: the embedding 'E' must come first, exactly once")
    if flat.count("L") != 1 or not flat.endswith("L"):
        raise ValueError(f"layout {s!r}: the loss 'L' must come last, exactly once")
    return tuple(sum(stages[v * pp + r].count("t") for v in range(vpp)) for r in range(pp))


FIRST_FLAG = "--decoder-first-pipeline-num-layers"
LAST_FLAG = "--decoder-last-pipeline-num-layers"


def uneven_flags(layers_per_stage: Sequence[int]) -> list[str] | None:
    """Megatron-LM's uneven-split flags for a split, or None if they cannot express it.

    ``[]`` for an even split (no flags needed); ``[FIRST_FLAG, "N"]`` and/or ``[LAST_FLAG, "M"]``
    when only the first and/or last stage differs from the equal middle stages; None when the
    middle stages differ or an edge stage that differs is empty (Megatron requires both flags to be
    > 0; use :func:`megatron_layout` then). With pp == 2 only the first-stage flag is used (the
    last stage takes the rest). Divisibility by vpp is the caller's (the split's) business.
    """
    lps = _check_split(layers_per_stage, 1)
    pp = len(lps)
    if len(set(lps)) == 1:
        return []
    if pp == 2:
        if min(lps) == 0:
            return None
        return [FIRST_FLAG, str(lps[0])]
    middle = lps[1:-1]
    if len(set(middle)) != 1:
        return None
    mid = middle[0]
    flags: list[str] = []
    if lps[0] != mid:
        if lps[0] == 0:
            return None
        flags += [FIRST_FLAG, str(lps[0])]
    if lps[-1] != mid:
        if lps[-1] == 0:
            return None
        flags += [LAST_FLAG, str(lps[-1])]
    return flags
