"""kernel_categories.py: every family of real kernel names (cuBLAS, CUTLASS, ATen, cub, inductor; nsys's cut and
:nvtx-name spellings) and CPU operator names gets the category a person would give it. The names of the real
profiles in ../shared/realdata are in test_realdata.py."""
from __future__ import annotations

import pytest

import kernel_categories as kc
import profile_tables as pt
from test_kernel_tables import (COMMA_KERNEL, DIRECT_COPY, FOREACH, MAX_REDUCE, MEMSET, QUOTE_KERNEL, SOFTMAX,
                                SUM_REDUCE, WHERE_KERNEL, XMMA)

REAL_NAMES = {
    "matrix multiply": [
        "ampere_sgemm_128x64_tn", "volta_sgemm_128x64_nn", XMMA,
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
        "kernel__5x_cublas",
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(T1::Params)",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
        "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams<T6>, "
        "const T4 *, const T5 *, T5 *, const T6 *, const T6 *, const T7 *, const T4 *, T7 *, void *, long, T6 *, "
        "int *)",
        "triton_tem_fused_mm_0", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, "
        "false, false, cutlass::bfloat16_t>, false, true, false, false, false, true, false>(Flash_fwd_params)",
        # fused attention of every kind: cuDNN's (sm80/sm90/sm100, forward and backward), FlashAttention for
        # Hopper/Blackwell, memory-efficient (CUTLASS fmha): their time is their two matmuls
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x1x1_kernel0_0",
        "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
        "cudnn_generated_fort_native_sdpa_sm100_flash_fprop_f16_knob_1_128x128x128_4x1x1_kernel0_0",
        "flash::FlashAttentionForwardSm100<cute::tuple<cute::C<128>, cute::C<128>, cute::C<128>>>",
        "fmha_cutlassF_f16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, "
        "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)",
        "fmha_cutlassB_f16_aligned_128x128_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::"
        "Sm80, cutlass::half_t, true, false, false, 128, 128, 128, false>::Params)",
        "aten::mm", "aten::bmm", "aten::addmm", "aten::_scaled_dot_product_flash_attention_for_cpu"],
    "elementwise": [
        COMMA_KERNEL, WHERE_KERNEL, FOREACH, "triton_poi_fused_add_mul_silu_0",
        "void at::native::unrolled_elementwise_kernel<at::native::exp_kernel_cuda(at::TensorIteratorBase &)::"
        "{lambda()#2}::operator ()() const::{lambda()#2}::operator ()() const::{lambda(float)#1}, "
        "at::detail::Array<char *, 2>, TrivialOffsetCalculator<1, unsigned int>>(int, T1, T2, T3)",
        "triton_for_fused_0",  # inductor's foreach (the compiled optimizer step)
        "void at::native::amp_update_scale_cuda_kernel(float *, int *, const float *, double, double, int)",
        "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<1>, "
        "at::native::<unnamed>::UnaryOpFunctor<float, 1, 1, 0>, at::native::_amp_foreach_non_finite_check_and_"
        "unscale_cuda_(c10::ArrayRef<at::Tensor>, at::Tensor &, const at::Tensor &)::{lambda()#1}::operator ()() "
        "const::{lambda()#2}::operator ()() const::{lambda(float)#1}>(int, T1, T2, T3)",
        "aten::mul", "aten::add_", "aten::_foreach_mul_", "aten::addcdiv_",
        # inductor's prefix decides, whatever ops the name lists after fused_ (index_put here)
        "triton_poi_fused_arange_ge_index_put_lift_fresh_0", "triton_poi_fused_gather_scatter_copy_0",
        # random numbers, one per element (the data's randint, weight initialisation)
        "void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, at::native::templates::"
        "cuda::uniform_and_transform<float, float, at::CUDAGeneratorImpl *, at::native::templates::cuda::"
        "normal_kernel<at::CUDAGeneratorImpl *>(const at::TensorBase &, double, double, T1)::{lambda()#1}::operator ()"
        "() const::{lambda()#2}::operator ()() const::{lambda(float)#1}>(at::TensorIteratorBase &, T3, T4)::{lambda"
        "(curandStatePhilox4_32_10 *)#2}, at::native::<unnamed>::distribution_nullary_kernel<float, float, float4, "
        "at::CUDAGeneratorImpl *, >(long, at::PhiloxCudaState, T3, T4)",
        "aten::randint", "aten::normal_"],
    "reduction/softmax": [
        MAX_REDUCE, SUM_REDUCE, SOFTMAX, "triton_red_fused__softmax_0", "triton_per_fused_mean_pow_rsqrt_0",
        "void <unnamed>::softmax_warp_forward<float, float, float, 9, false, false>(T2 *, const T1 *, int, int, int, "
        "const bool *, int, bool)", "aten::_softmax", "aten::amax", "aten::sum",
        # scans (cumsum): ATen's, cub's, inductor's
        "void at::native::tensor_kernel_scan_innermost_dim<float, std::plus<float>>(T1 *, const T1 *, unsigned int, "
        "unsigned int, unsigned int, T1, T2)",
        "void at_cuda_detail::cub::DeviceScanKernel<at_cuda_detail::cub::DeviceScanPolicy<long, std::plus<long>>::"
        "Policy900, const long *, long *, at_cuda_detail::cub::ScanTileState<long, true>, std::plus<long>, "
        "at_cuda_detail::cub::NullType, int, long>(T2, T3, T4, int, T5, T6, T7)",
        "triton_spl_fused_cumsum_0", "aten::cumsum",
        # indexing that ADDS rows sharing an index: the embedding backward (index_put_ with accumulate sorts the
        # token ids and sums their gradient rows), scatter_add / index_add; the cross-entropy's nll_loss
        "void at::native::<unnamed>::indexing_backward_kernel<float, 4>(const long *, const long *, "
        "const T1 *, T1 *, long, long, long, long, bool)",
        "void at::native::_scatter_gather_elementwise_kernel<128, 4, at::native::_cuda_scatter_gather_internal_kernel"
        "<true, float>::operator ()<at::native::ReduceAdd>(at::TensorIterator &, long, long, long, const T1 &)::"
        "{lambda(int)#1}>(int, T3)",
        "void at::native::indexFuncLargeIndex<float, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo"
        "<T1, T3>, at::cuda::detail::TensorInfo<const T1, T3>, at::cuda::detail::TensorInfo<const T2, T3>, int, int, "
        "T3, T3, long, long, const T1 &, T1)",
        "void at::native::<unnamed>::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(T1 *, T1 *, const "
        "T1 *, const T3 *, const T1 *, bool, long, long, long, long)",
        "aten::embedding_dense_backward", "aten::scatter_add_", "aten::index_add_", "aten::nll_loss_forward"],
    "memory copy/set": [
        DIRECT_COPY, MEMSET, "[CUDA memcpy Device-to-Device]", "Memcpy DtoD (Device -> Device)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char *, "
        "1>>(int, T2, T3)", "void at::native::<unnamed>::CatArrayBatchedCopy<at::native::<unnamed>::OpaqueType<4>, "
        "unsigned int, 3, 64, 64>(T1 *, CatArrInputTensorMetadata<T1, T2, T4, T5>, TensorSizeStride<T2, 4>, int, T2)",
        "aten::copy_", "aten::zero_", "aten::clone",
        # indexing that only moves data: the embedding lookup, cross_entropy's gather, scatter (assign)
        "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_"
        "impl<at::native::OpaqueType<4>>(at::TensorIteratorBase &, c10::ArrayRef<long>, c10::ArrayRef<long>)::"
        "{lambda(char *, const char *, long)#1}>(at::TensorIteratorBase &, c10::ArrayRef<long>, c10::ArrayRef<long>, "
        "const T1 &, bool)::{lambda(int)#1}>(long, T3)",
        "void at::native::_scatter_gather_elementwise_kernel<128, 4, at::native::_cuda_scatter_gather_internal_kernel"
        "<false, float>::operator ()<at::native::TensorAssign>(at::TensorIterator &, long, long, long, const T1 &)::"
        "{lambda(int)#1}>(int, T3)",
        "void at::native::vectorized_gather_kernel<16, long>(char *, char *, T2 *, int, long, long, long, long, bool)",
        "aten::index", "aten::gather", "aten::embedding", "aten::index_select"],
    "other": [
        QUOTE_KERNEL, "autograd::engine::evaluate_function: MmBackward0", "triton_unk_fused_0",
        # sorting (the embedding backward sorts the token ids first): none of the four, by decision
        "void at_cuda_detail::cub::DeviceRadixSortSingleTileKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<long, "
        "at::cuda::cub::detail::OpaqueType<8>, unsigned long long>::Policy900, false, long, at::cuda::cub::detail::"
        "OpaqueType<8>, unsigned long long>(const T3 *, T3 *, const T4 *, T4 *, T5, int, int)",
        "aten::sort"],
}


@pytest.mark.parametrize("category", list(REAL_NAMES))
def test_classifier_knows_the_real_families(category: str):
    assert {name: kc.classify_kernel(name) for name in REAL_NAMES[category]} == dict.fromkeys(REAL_NAMES[category],
                                                                                             category)


def test_short_name_drops_parameters_and_truncates():
    assert pt.short_name("void foo<int, 4>(float *, int)") == "foo<int, 4>"
    assert pt.short_name(XMMA, width=20) == XMMA[:19] + "…"
