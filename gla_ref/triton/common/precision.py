"""How exactly a Triton kernel's ``tl.dot`` multiplies: the ``input_precision`` its launcher passes.

Every kernel takes the choice as a constexpr (``PREC``; the backward's fast-form matmuls ``FPREC``),
made here on the host from the inputs' dtype. ``"ieee"`` multiplies float32 operands exactly, ``"tf32"``
rounds them to TF32 (10 mantissa bits) for one tensor-core product, ``"tf32x3"`` sums three TF32
products (float32's accuracy on tensor cores). 16-bit operands are multiplied as they are, whatever
the setting: it matters only where a kernel hands ``tl.dot`` float32 operands.
"""

from __future__ import annotations

import torch


def dot_precision(x: torch.Tensor) -> str:
    """``input_precision`` of the kernels' matmuls for inputs of ``x``'s dtype: IEEE for float32 inputs,
    exact float32 products (TF32 would cost ~1e-3 relative error); TF32 for 16-bit inputs, whose 16-bit
    operands ignore it (and whose float32 operands, in the forward's fast forms, take one TF32 product)."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


def fast_grad_dot_precision(x: torch.Tensor) -> str:
    """``input_precision`` of the backward's fast-form matmuls for dq and dk, whose float32 operands carry
    the factors e^{±b}: IEEE for float32 inputs, three TF32 products (float32's accuracy on tensor cores)
    for 16-bit ones. (The forward's fast form takes one TF32 product, :func:`dot_precision`: A and P are
    rounded to the input dtype right after, and three products there cost the H200's intra kernel
    0.37 -> 0.81 ms.) One TF32 product (10 mantissa bits) took the gate gradient of 60-nat sub-chunks to
    5.6e-3 relative RMSE against float64 on the H200 (fp16 and bf16), where the exact form gives 2e-4 and
    1.4e-3: dg subtracts q ⊙ dq and k ⊙ dk terms far larger than itself there."""
    return "ieee" if x.dtype == torch.float32 else "tf32x3"
