"""What kind of work a GPU kernel (or a CPU operator) is: matrix multiply, elementwise, reduction/softmax, memory
copy/set, or other, from its name alone. profile_tables.py's table 3 and its top-kernel tables use it; the rules
and why each family sits where it does are in docs/nsys_run.md ("Reading the tables"). torch-free.

Every kernel name of the real profiles in ../shared/realdata (cuBLAS, CUTLASS, ATen, cub; nsys 2023.4 to 2026.1
spellings, names cut at 100 characters with "…", and `:nvtx-name` report names "RANGE/KERNEL") is listed with
its category in test_kernel_categories.py and test_realdata.py.
"""
from __future__ import annotations

import re

CATEGORIES = ("matrix multiply", "elementwise", "reduction/softmax", "memory copy/set", "other")

# Inductor names its kernels triton_<first 3 letters of the kind>_ (torch/_inductor/codegen/triton.py):
# poi(ntwise), for(each), red(uction), per(sistent reduction), spl(it scan), tem(plate: its matmuls). The prefix
# says what the kernel is, whatever ops its name lists after "fused_" (triton_poi_fused_arange_ge_index_put_0
# is one pointwise kernel, not an index_put), so it decides before any substring rule.
INDUCTOR_PREFIXES = {"triton_tem_": "matrix multiply", "triton_poi_": "elementwise", "triton_for_": "elementwise",
                     "triton_red_": "reduction/softmax", "triton_per_": "reduction/softmax",
                     "triton_spl_": "reduction/softmax"}

# The other families, first match wins, so the specific ones come first: PyTorch's copies and its gather / index
# kernels are elementwise_kernel templates (direct_copy_kernel_cuda, _scatter_gather_elementwise_kernel,
# index_elementwise_kernel), and cuBLAS's split-K epilogue is called splitKreduce but belongs to its GEMM.
_KERNEL_RULES: list[tuple[str, re.Pattern]] = [
    # Indexing that ADDS values sharing an index is a reduction, not a copy: the embedding backward
    # (indexing_backward_kernel: index_put_ with accumulate=True sorts the token ids and sums the gradient rows
    # of equal ids; embedding_backward_* and compute_grad_weight do the same), scatter_add / index_add
    # (scatter_gather with ReduceAdd, indexFunc{Small,Large}Index), and the cross-entropy's nll_loss kernels
    # (the mean over the batch; the backward writes that mean's gradient at the targets).
    ("reduction/softmax", re.compile(
        r"indexing_backward|embedding_backward|compute_grad_weight|sum_and_scatter|scatter_add|ReduceAdd"
        r"|indexFunc(Small|Large)Index|index_add|nll_loss", re.IGNORECASE)),
    # copies and fills, and the indexing that only moves data (gather, scatter, index, index_put without
    # accumulation, index_select: the embedding lookup, the cross-entropy's gather)
    ("memory copy/set", re.compile(
        r"direct_copy_kernel|\[CUDA mem(cpy|set)|^Mem(cpy|set)\b|CatArrayBatchedCopy|FillFunctor|copy_kernel"
        r"|gather|scatter|index_elementwise|index_put|indexSelect|index_select", re.IGNORECASE)),
    # cuBLAS sgemm (ampere_/volta_sgemm_*), xmma (sm80_/sm90_xmma_*), CUTLASS (cutlass::Kernel2<cutlass_80_...gemm>,
    # which a `:base` report prints as just "Kernel2"), Hopper cuBLAS (nvjet_*), gemv, and fused attention kernels,
    # whose time is dominated by their two matmuls: FlashAttention (pytorch_flash::flash_fwd_kernel,
    # flash::FlashAttention...Sm90/Sm100), memory-efficient (fmha_cutlassF/B), cuDNN's
    # (cudnn_generated_fort_native_sdpa_sm90_flash_fprop_*)
    ("matrix multiply", re.compile(
        r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitKreduce|flash|fmha|_sdpa_|^Kernel2$", re.IGNORECASE)),
    # softmax kernels (cunn_SoftMax*, softmax_warp_*), at::native::reduce_kernel (sum, amax, mean), scans
    # (cumsum: tensor_kernel_scan_*, cub's DeviceScanKernel)
    ("reduction/softmax", re.compile(r"softmax|reduce_kernel|scan|welford", re.IGNORECASE)),
    # at::native::{vectorized_,unrolled_,}elementwise_kernel (and elementwise_kernel_with_index: arange), the
    # multi-tensor (foreach) kernels of the optimizer, the grad scaler's one-thread scale update
    # (amp_update_scale_cuda_kernel), and random number generation, one value per element
    # (distribution_elementwise_grid_stride_kernel: randint, normal_, uniform_)
    ("elementwise", re.compile(r"elementwise_kernel|multi_tensor_apply|foreach|amp_update_scale"
                               r"|distribution_elementwise", re.IGNORECASE)),
    # Sorting (cub's DeviceRadixSort*, which the embedding backward runs on the token ids before summing) is
    # none of the four: "other" by decision, not by default.
    ("other", re.compile(r"RadixSort|DeviceSegmentedSort|bitonicSort", re.IGNORECASE)),
]

# CPU operators (torch.profiler without CUDA) by their aten name, without the trailing "_" of in-place variants.
_OP_CATEGORIES: dict[str, frozenset[str]] = {
    "matrix multiply": frozenset({
        "mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum",
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"}),
    "reduction/softmax": frozenset({
        "sum", "mean", "amax", "amin", "max", "min", "softmax", "_softmax", "_softmax_backward_data",
        "log_softmax", "_log_softmax", "_log_softmax_backward_data", "logsumexp", "norm", "var", "std",
        "argmax", "argmin", "prod", "cumsum", "nll_loss", "nll_loss_forward", "nll_loss_backward",
        "nll_loss_nd", "cross_entropy_loss",
        # accumulating indexing (see the kernel rules): the embedding backward, scatter_add, index_add
        "embedding_backward", "embedding_dense_backward", "scatter_add", "index_add"}),
    "memory copy/set": frozenset({
        "copy", "clone", "contiguous", "zero", "fill", "zeros", "zeros_like", "ones", "ones_like", "full",
        "full_like", "cat", "stack", "to", "_to_copy", "empty", "empty_like", "empty_strided", "new_zeros",
        "new_empty", "new_empty_strided", "gather", "scatter", "index", "index_put", "_index_put_impl",
        "index_select", "embedding"}),
    "elementwise": frozenset({
        "add", "sub", "rsub", "mul", "div", "neg", "exp", "log", "sigmoid", "silu", "rsqrt", "sqrt", "pow",
        "tanh", "gelu", "relu", "where", "masked_fill", "abs", "reciprocal", "lerp", "addcmul", "addcdiv",
        "maximum", "minimum", "clamp", "ge", "gt", "le", "lt", "eq", "ne", "cos", "sin", "square",
        "sigmoid_backward", "silu_backward", "tanh_backward", "threshold_backward", "gelu_backward",
        "randint", "rand", "randn", "normal", "uniform", "random", "bernoulli"}),
}


def kernel_part(name: str) -> str:
    """The kernel's own name in a `nsys stats --report ...:nvtx-name` row, which prints RANGE/KERNEL
    ("attention_softmax/elementwise_kernel"): the text after the last '/' that comes before the name's first
    template or parameter list (a '/' inside those, as in `operator/`, belongs to the kernel)."""
    head = re.split(r"[<(\[]", name, maxsplit=1)[0]
    cut = head.rfind("/")
    return name[cut + 1:] if cut >= 0 else name


def classify_kernel(name: str) -> str:
    """One of CATEGORIES for a GPU kernel name (any family PyTorch, cuBLAS, CUTLASS, cub or inductor emits) or a
    CPU operator name ("aten::mm")."""
    if name.startswith("aten::"):
        op = name[len("aten::"):]
        if op.startswith("_foreach_"):
            return "elementwise"
        for category, ops in _OP_CATEGORIES.items():
            if op in ops or op.rstrip("_") in ops:
                return category
        return "other"
    kernel = kernel_part(name).removeprefix("void ")
    for prefix, category in INDUCTOR_PREFIXES.items():
        if kernel.startswith(prefix):
            return category
    for category, pattern in _KERNEL_RULES:
        if pattern.search(kernel):
            return category
    return "other"
