"""The few redirections megatron-core 0.16 needs to train on CPU processes (gloo).

megatron-core assumes CUDA in a handful of places: ``torch.cuda.current_device()`` as a device argument,
literal ``device='cuda'`` and ``pin_memory`` in the optimizer, grad clipping, schedules and utils, the
CUDA RNG tracker, ``Tensor.type()`` checks against ``torch.cuda.*Tensor`` names, CUDA streams and events in
the MoE all-to-all dispatcher, and Transformer Engine's GEMM for the router. :func:`apply` points each of
them at the CPU. It is called only inside worker processes when no GPU is present (never in the test
process or the planner), and applying it twice is harmless.
"""

from __future__ import annotations

import contextlib
import functools

_APPLIED = {"done": False}


def _cpu_device(device):
    """Map any CUDA device spelling to the CPU."""
    if device is None:
        return None
    text = str(device)
    if text.startswith("cuda") or isinstance(device, int):
        return "cpu"
    return device


def _redirect_factory(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        kwargs.pop("pin_memory", None)
        return fn(*args, **kwargs)

    return wrapper


class _NullStream:
    """Stands in for torch.cuda.Stream / Event: CPU work is already ordered."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args, **kwargs):
        pass

    def wait_event(self, *args, **kwargs):
        pass

    def record_event(self, *args, **kwargs):
        return _NullStream()

    def record(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def __eq__(self, other):
        return isinstance(other, _NullStream)

    def __hash__(self):
        return 0


def apply() -> None:
    """Redirect megatron-core's CUDA assumptions to the CPU in this process."""
    if _APPLIED["done"]:
        return
    import torch

    # Device queries and synchronisation.
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.device_count = lambda: 0
    torch.cuda.Stream = _NullStream
    torch.cuda.Event = _NullStream
    torch.cuda.current_stream = lambda *a, **k: _NullStream()
    torch.cuda.default_stream = lambda *a, **k: _NullStream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()

    # Literal device='cuda' and pin_memory=True in tensor factories; .cuda() is the identity.
    for name in ("tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand", "zeros_like",
                 "empty_like", "ones_like", "full_like"):
        setattr(torch, name, _redirect_factory(getattr(torch, name)))
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        args = tuple(_cpu_device(a) if isinstance(a, str) or isinstance(a, torch.device) else a for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        kwargs.pop("non_blocking", None)
        return original_to(self, *args, **kwargs)

    torch.Tensor.to = to

    # Optimizer and grad-clipping dtype checks compare against torch.cuda.*Tensor names.
    original_type = torch.Tensor.type

    def tensor_type(self, *args, **kwargs):
        if args or kwargs:
            return original_type(self, *args, **kwargs)
        name = original_type(self)
        return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name

    torch.Tensor.type = tensor_type

    # The CUDA RNG tracker keeps CPU generator states instead.
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    torch.cuda.manual_seed_all = lambda seed: None     # torch.manual_seed calls it after seeding the CPU
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)

    # torch's LayerNorm wrapper refuses sequence parallel; the norm itself is fine, its weights only need the
    # `sequence_parallel` mark so finalize_model_grads all-reduces their gradients over the TP group.
    from megatron.core.transformer import torch_norm

    def norm_new(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                 normalization="LayerNorm"):
        norm_cls = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}[config.normalization]
        norm = norm_cls(normalized_shape=hidden_size, eps=eps)
        for p in norm.parameters():
            p.sequence_parallel = bool(config.sequence_parallel)
        return norm

    torch_norm.WrappedTorchNorm.__new__ = norm_new

    # MoE: without Transformer Engine moe_utils never defines te_general_gemm, yet the router reads it;
    # None selects its torch fallback.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    # gloo's all_to_all_single wants plain lists for split sizes.
    original_a2a = torch.distributed.all_to_all_single

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
        if isinstance(output_split_sizes, torch.Tensor):
            output_split_sizes = output_split_sizes.tolist()
        if isinstance(input_split_sizes, torch.Tensor):
            input_split_sizes = input_split_sizes.tolist()
        return original_a2a(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

    torch.distributed.all_to_all_single = all_to_all_single
    _APPLIED["done"] = True
