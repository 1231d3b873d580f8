"""Gradient compression of the data-parallel traffic: fewer bytes on the wire, extra kernels, a residual buffer.

Blockwise quantisation with error feedback (Seide et al. 2014, "1-bit stochastic gradient descent";
Karimireddy et al. 2019, "Error feedback fixes SignSGD and other gradient compression schemes",
arXiv:1901.09847): each rank adds its residual to the local gradient, quantises it in blocks with one fp32
scale per block, and keeps the quantisation error as the next residual. The reduce-scatter runs as an
exchange of quantised chunks that every rank dequantises and sums (ZeRO++ qgZ, Wang et al. 2023,
arXiv:2306.10209), so the data-parallel gradient collective moves ``wire_bytes_per_element`` instead of the
gradient dtype's bytes. The kernels stream over the rank's whole local gradient once per step (HBM-bound):
read the gradient, read and write the fp32 residual, write the quantised copy, read the received chunks.

``costmodel.estimate.estimate_arrays(..., grad_compression=...)`` applies it; the default (None) is the
uncompressed collective and leaves every estimate unchanged.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from costmodel.profiles import InputError

SCALE_BYTES = 4.0
"""One fp32 scale per quantisation block (module doc)."""


class GradCompression(BaseModel):
    """A gradient compressor of the data-parallel reduce."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Label for reports."""
    wire_bits: float = Field(gt=0)
    """Bits per gradient element on the wire (before block scales)."""
    block_elements: int = Field(default=2048, ge=1)
    """Elements sharing one fp32 scale."""
    residual_bytes_per_element: float = Field(default=4.0, ge=0)
    """Error-feedback residual kept per local gradient element (fp32)."""

    @property
    def wire_bytes_per_element(self) -> float:
        return self.wire_bits / 8.0 + SCALE_BYTES / self.block_elements

    def kernel_bytes_per_element(self, grad_bytes: float) -> float:
        """HBM traffic of compress + decompress per local gradient element: read the gradient, read and
        write the residual, write the quantised copy, read the received quantised chunks."""
        return grad_bytes + 2.0 * self.residual_bytes_per_element + 2.0 * self.wire_bytes_per_element


COMPRESSORS = {
    "int8": GradCompression(name="int8", wire_bits=8),
    "int4": GradCompression(name="int4", wire_bits=4),
}
NONE_NAMES = ("none", "off", "no")


def get_compression(name: str | None) -> GradCompression | None:
    """A compressor by name; None for none/off/no (the uncompressed collective)."""
    if name is None or str(name).strip().lower() in NONE_NAMES:
        return None
    key = str(name).strip().lower().replace("-ef", "").replace("bit", "")
    key = {"8": "int8", "4": "int4"}.get(key, key)
    if key not in COMPRESSORS:
        raise InputError(f"gradient compression {name!r}: valid values are none, {', '.join(COMPRESSORS)} "
                         f"(blockwise quantisation with error feedback)")
    return COMPRESSORS[key]
