"""The analysis tools on real GPU output that nobody here made (../shared/realdata; its README says what and from
where): a student's nsys SQLite export read by kernel_tables.py, its counts checked against what nsys stats printed
for that profile and its kernel time against the real nsys stats 2023.4.4 reading the same file, with table 1
filled from the student's own NVTX ranges; every kernel name of the real profiles through the classifier, each
with the category a person would give it; a student's CUDA memory snapshots through mem_profile.py --analyze,
naming the student's own lines. The files are read where they are, never copied into the project; without them
(or without a real nsys, for the cross-check) the tests are skipped with the reason (pytest -rs prints it).
"""
from __future__ import annotations

import re
import sqlite3
import statistics
import subprocess
from pathlib import Path

import pytest

import kernel_tables as kt
import mem_profile
from results import read_records
from test_nsys import find_real_nsys

HERE = Path(__file__).resolve().parent
# ../shared/realdata from the main checkout; a worktree sits one level deeper
REALDATA = next((folder for folder in (HERE.parent / "shared" / "realdata", HERE.parent.parent / "shared" / "realdata")
                 if folder.is_dir()), None)
SQLITE = "rtx3070ti_train_nsys2025.1.3.sqlite"
TEXT_REPORTS = ("a100_2.7b_ctx512_forward_cuda_gpu_kern_sum_nsys2026.1.1.txt",
                "a100_2.7b_ctx512_train_step_cuda_gpu_kern_sum_nsys2026.1.1.txt",
                "a100_2.7b_ctx512_train_step_cuda_gpu_kern_sum_nvtx_nsys2026.1.1.txt")
SNAPSHOTS = ("cuda_snapshot_own_model_train.pickle", "cuda_snapshot_own_model_forward_mixed.pickle")
STUDENT_ROOT = "/home/niu/code/cs336/assignment2-systems"  # where the snapshots' student kept their code


def realdata(name: str) -> Path:
    if REALDATA is None or not (REALDATA / name).is_file():
        pytest.skip(f"no {name}: the real GPU material is read from ../shared/realdata, absent here")
    return REALDATA / name


# ---- every kernel name, with the category a person would give it ----

# As `nsys stats --report cuda_gpu_kern_sum` 2026.1.1 printed them on an A100-class GPU (2.7B model): names cut
# at 100 characters with "…", and in the :nvtx-name:base report as RANGE/BASE-NAME. A cut name is judged by what
# it shows (the cut elementwise_kernel<...gpu_kernel_impl_nocast<at::n… may be a copy: nobody can tell).
NSYS_2026_TEXT_NAMES = {
    'matrix multiply': [
        'sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_exe…',
        'sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_ex…',
        'sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x32x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_ex…',
        'sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_exe…',
        'sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_ex…',
        'void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(T1::Params)',
        'sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_exe…',
        'void cutlass::Kernel2<cutlass_80_simt_sgemm_128x128_8x4_nt_align1>(T1::Params)',
        'sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_ex…',
        'sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize128x32x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_ex…',
        'Kernel2',
        'forward/sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_ali…',
        'forward/sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma_aligna4_al…',
        'attention_value_matmul/sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x32x8_stage3_warpsize2x2x1_…',
        'attention_scores_matmul/sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x64x8_stage3_warpsize2x2x1…',
    ],
    'elementwise': [
        'void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::n…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::BinaryFunctor<float, float, floa…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::BUnaryFunctor<float, float, floa…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::exp_kernel_cuda(at::TensorIterat…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, std::arr…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::sigmoid_kernel_cuda(at::TensorIt…',
        'void at::native::vectorized_elementwise_kernel<(int)4, void at::native::<unnamed>::pow_tensor_scala…',
        'void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl_nocast<at::n…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctorOnSelf_add<float>, st…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::rsqrt_kernel_cuda(at::TensorIter…',
        'void <unnamed>::elementwise_kernel_with_index<int, at::native::arange_cuda_out(const c10::Scalar &,…',
        'void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<unsigned int, (int)4, void …',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::AUnaryFunctor<float, float, floa…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::sqrt_kernel_cuda(at::TensorItera…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::neg_kernel_cuda(at::TensorIterat…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::sigmoid_backward_kernel_cuda(at:…',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::BUnaryFunctor<long, long, long, …',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::AUnaryFunctor<long, long, long, …',
        'optimizer_step/vectorized_elementwise_kernel',
        'elementwise_kernel',
        'vectorized_elementwise_kernel',
        'forward/elementwise_kernel',
        'attention_softmax/elementwise_kernel',
        'forward/vectorized_elementwise_kernel',
        'scaled_dot_product_attention/elementwise_kernel',
        'attention_scores_matmul/vectorized_elementwise_kernel',
        'attention_softmax/vectorized_elementwise_kernel',
        'attention_value_matmul/elementwise_kernel',
        'forward/elementwise_kernel_with_index',
        'scaled_dot_product_attention/vectorized_elementwise_kernel',
        'elementwise_kernel_with_index',
        'backward/vectorized_elementwise_kernel',
        'distribution_elementwise_grid_stride_kernel',
    ],
    'reduction/softmax': [
        'void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MaxOps<flo…',
        'void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::func_wrapp…',
        'void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MeanOps<fl…',
        'void at::native::reduce_kernel<(int)128, (int)4, at::native::ReduceOp<float, at::native::func_wrapp…',
        'void at::native::<unnamed>::cunn_SoftMaxBackward<(int)4, float, float, float, at::native::<unnamed>…',
        'void at::native::<unnamed>::cunn_SoftMaxForwardSmem<(int)4, float, float, float, at::native::<unnam…',
        'void at::native::<unnamed>::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(T1 *, T1 *, …',
        'void at::native::<unnamed>::nll_loss_backward_reduce_cuda_kernel_2d<float, long>(T1 *, const T1 *, …',
        'void <unnamed>::indexing_backward_kernel<float, (int)4>(const long *, const long *, const T1 *, T1 …',
        'reduce_kernel',
        'attention_softmax/reduce_kernel',
        'forward/reduce_kernel',
        'cunn_SoftMaxBackward',
        'forward/cunn_SoftMaxForwardSmem',
        'forward/nll_loss_forward_reduce_cuda_kernel_2d',
        'nll_loss_backward_reduce_cuda_kernel_2d',
        'indexing_backward_kernel',
    ],
    'memory copy/set': [
        'void at::native::index_elementwise_kernel<(int)128, (int)4, void at::native::gpu_index_kernel<void …',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, std::array<c…',
        'void at::native::<unnamed>::CatArrayBatchedCopy<at::native::<unnamed>::OpaqueType<(unsigned int)4>,…',
        'void at::native::<unnamed>::CatArrayBatchedCopy_aligned16_contig<at::native::<unnamed>::OpaqueType<…',
        'void at::native::_scatter_gather_elementwise_kernel<(int)128, (int)4, void at::native::_cuda_scatte…',
        'CatArrayBatchedCopy',
        'CatArrayBatchedCopy_aligned16_contig',
        'forward/index_elementwise_kernel',
        '_scatter_gather_elementwise_kernel',
    ],
    'other': [
        'void at_cuda_detail::cub::DeviceRadixSortSingleTileKernel<at_cuda_detail::cub::DeviceRadixSortPolic…',
        'DeviceRadixSortSingleTileKernel',
    ],
}
SQLITE_KERNEL_NAMES = {
    'matrix multiply': [
        'ampere_sgemm_128x128_nn',
        'ampere_sgemm_128x128_nt',
        'ampere_sgemm_128x128_tn',
        'ampere_sgemm_128x64_nn',
        'ampere_sgemm_128x64_nt',
        'ampere_sgemm_128x64_tn',
        'ampere_sgemm_64x64_nn',
        'void cutlass::Kernel2<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>(T1::Params)',
        'void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(T1::Params)',
        'void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nt_align1>(T1::Params)',
    ],
    'elementwise': [
        'void <unnamed>::elementwise_kernel_with_index<int, at::native::arange_cuda_out(const c10::Scalar &, '
        'const c10::Scalar &, const c10::Scalar &, at::Tensor &)::[lambda() (instance 1)]::operator ()() cons'
        't::[lambda() (instance 4)]::operator ()() const::[lambda(long) (instance 1)]>(T1, T2, function_trait'
        's<T2>::result_type *)',
        'void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<(int'
        ')1>, at::native::<unnamed>::BinaryOpScalarFunctor<float, (int)1, (int)1, (int)0>, std::multiplies<fl'
        'oat>, float>(T1, T2, T3...)',
        'void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<(int'
        ')1>, at::native::<unnamed>::BinaryOpScalarFunctor<float, (int)1, (int)1, (int)0>, std::plus<float>, '
        'float>(T1, T2, T3...)',
        'void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<(int'
        ')2>, at::native::<unnamed>::TernaryOpScalarFunctor<float, (int)2, (int)2, (int)0>, at::native::LerpF'
        'unctor<float>, float>(T1, T2, T3...)',
        'void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<(int'
        ')2>, at::native::<unnamed>::UnaryOpFunctor<float, (int)2, (int)1, (int)1>, at::native::Sqrt<float>>('
        'T1, T2, T3...)',
        'void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<(int'
        ')3>, at::native::<unnamed>::PointwiseOpScalarFunctor<float, (int)3, (int)3, (int)0>, std::multiplies'
        '<float>, float>(T1, T2, T3...)',
        'void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListScalarListMet'
        'adata<float, (int)1>, at::native::<unnamed>::BinaryOpScalarListFunctor<float, (int)1, (int)1, (int)0'
        '>, std::divides<float>>(T1, T2, T3...)',
        'void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListScalarListMet'
        'adata<float, (int)3>, at::native::<unnamed>::PointwiseOpScalarListFunctor<float, (int)3, (int)3, (in'
        't)0>, std::divides<float>>(T1, T2, T3...)',
        'void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::na'
        'tive::<unnamed>::where_kernel_impl(at::TensorIterator &)::[lambda() (instance 1)]::operator ()() con'
        'st::[lambda() (instance 7)]::operator ()() const::[lambda(bool, float, float) (instance 1)]>(at::Ten'
        'sorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)',
        'void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::na'
        'tive::BUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>(at::Tensor'
        'IteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)',
        'void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::na'
        'tive::BinaryFunctor<float, float, float, at::native::binary_internal::DivFunctor<float>>>(at::Tensor'
        'IteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)',
        'void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::na'
        'tive::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>(at::Tensor'
        'IteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)',
        'void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::na'
        'tive::CUDAFunctor_add<float>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int'
        ', T3)',
        'void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::na'
        'tive::neg_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 2)]::operator ()() const::[lamb'
        'da() (instance 7)]::operator ()() const::[lambda(float) (instance 1)]>(at::TensorIteratorBase &, con'
        'st T1 &)::[lambda(int) (instance 1)]>(int, T3)',
        'void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl_nocast<at::na'
        'tive::<unnamed>::CompareFunctor<long>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance'
        ' 1)]>(int, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::AUnaryFunctor<float, float, float'
        ', at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)2>>(int, T2, T3'
        ')',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::AUnaryFunctor<long, long, long, a'
        't::native::binary_internal::MulFunctor<long>>, std::array<char *, (unsigned long)2>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::BUnaryFunctor<float, float, float'
        ', at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)2>>(int, T2, T3'
        ')',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::BUnaryFunctor<long, long, long, a'
        't::native::binary_internal::div_trunc_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 1)]'
        '::operator ()() const::[lambda() (instance 4)]::operator ()() const::[lambda(long, long) (instance 1'
        ')]>, std::array<char *, (unsigned long)2>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::BUnaryFunctor<long, long, long, a'
        't::native::remainder_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 1)]::operator ()() c'
        'onst::[lambda() (instance 4)]::operator ()() const::[lambda(long, long) (instance 1)]>, std::array<c'
        'har *, (unsigned long)2>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::BinaryFunctor<float, float, float'
        ', at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)3>>(int, T2, T3'
        ')',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctorOnSelf_add<float>, std'
        '::array<char *, (unsigned long)2>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, std::arra'
        'y<char *, (unsigned long)3>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::exp_kernel_cuda(at::TensorIterato'
        'rBase &)::[lambda() (instance 2)]::operator ()() const::[lambda() (instance 2)]::operator ()() const'
        '::[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::neg_kernel_cuda(at::TensorIterato'
        'rBase &)::[lambda() (instance 2)]::operator ()() const::[lambda() (instance 7)]::operator ()() const'
        '::[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::rsqrt_kernel_cuda(at::TensorItera'
        'torBase &)::[lambda() (instance 2)]::operator ()() const::[lambda() (instance 2)]::operator ()() con'
        'st::[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::sigmoid_backward_kernel_cuda(at::'
        'TensorIteratorBase &)::[lambda() (instance 2)]::operator ()() const::[lambda() (instance 2)]::operat'
        'or ()() const::[lambda(float, float) (instance 1)], std::array<char *, (unsigned long)3>>(int, T2, T'
        '3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::sigmoid_kernel_cuda(at::TensorIte'
        'ratorBase &)::[lambda() (instance 2)]::operator ()() const::[lambda() (instance 2)]::operator ()() c'
        'onst::[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, void at::native::<unnamed>::pow_tensor_scalar'
        '_kernel_impl<float, float>(at::TensorIteratorBase &, T2)::[lambda(float) (instance 1)], std::array<c'
        'har *, (unsigned long)2>>(int, T2, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, void at::native::<unnamed>::pow_tensor_scalar'
        '_kernel_impl<float, float>(at::TensorIteratorBase &, T2)::[lambda(float) (instance 2)], std::array<c'
        'har *, (unsigned long)2>>(int, T2, T3)',
    ],
    'reduction/softmax': [
        'void <unnamed>::indexing_backward_kernel<float, (int)4>(const long *, const long *, const T1 *, T1 *'
        ', long, long, long, long, bool)',
        'void at::native::<unnamed>::cunn_SoftMaxBackward<(int)4, float, float, float, at::native::<unnamed>:'
        ':LogSoftMaxBackwardEpilogue>(T2 *, const T4 *, const T4 *, long)',
        'void at::native::<unnamed>::cunn_SoftMaxForwardSmem<(int)4, float, float, float, at::native::<unname'
        'd>::LogSoftMaxForwardEpilogue, long>(T4 *, const T2 *, T6)',
        'void at::native::<unnamed>::nll_loss_backward_reduce_cuda_kernel_2d<float, long>(T1 *, const T1 *, c'
        'onst T2 *, const T1 *, const T1 *, bool, int, int, long, long)',
        'void at::native::<unnamed>::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(T1 *, T1 *, c'
        'onst T1 *, const T3 *, const T1 *, bool, long, long, long, long)',
        'void at::native::reduce_kernel<(int)128, (int)4, at::native::ReduceOp<float, at::native::func_wrappe'
        'r_t<float, at::native::sum_functor<float, float, float>::operator ()(at::TensorIterator &)::[lambda('
        'float, float) (instance 1)]>, unsigned int, float, (int)4>>(T3)',
        'void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MaxOps<floa'
        't>, unsigned int, float, (int)4>>(T3)',
        'void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MeanOps<flo'
        'at, float, float, float>, unsigned int, float, (int)4>>(T3)',
        'void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::func_wrappe'
        'r_t<float, at::native::sum_functor<float, float, float>::operator ()(at::TensorIterator &)::[lambda('
        'float, float) (instance 1)]>, unsigned int, float, (int)4>>(T3)',
    ],
    'memory copy/set': [
        'void at::native::<unnamed>::CatArrayBatchedCopy<at::native::<unnamed>::OpaqueType<(unsigned int)4>, '
        'unsigned int, (int)4, (int)64, (int)64>(T1 *, at::native::<unnamed>::CatArrInputTensorMetadata<T1, T'
        '2, T4, T5>, at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4>, int, T2)',
        'void at::native::<unnamed>::CatArrayBatchedCopy_aligned16_contig<at::native::<unnamed>::OpaqueType<('
        'unsigned int)4>, unsigned int, (int)4, (int)128, (int)1>(T1 *, at::native::<unnamed>::CatArrInputTen'
        'sorMetadata<T1, T2, T4, T5>, at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4>, int, T2)',
        'void at::native::_scatter_gather_elementwise_kernel<(int)128, (int)4, void at::native::_cuda_scatter'
        '_gather_internal_kernel<(bool)1, at::native::OpaqueType<(int)4>>::operator ()<at::native::TensorAssi'
        'gn>(at::TensorIterator &, long, long, long, const T1 &)::[lambda(int) (instance 1)]>(int, T3)',
        'void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::na'
        'tive::direct_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 3)]::operator ()() cons'
        't::[lambda() (instance 7)]::operator ()() const::[lambda(float) (instance 1)]>(at::TensorIteratorBas'
        'e &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)',
        'void at::native::index_elementwise_kernel<(int)128, (int)4, void at::native::gpu_index_kernel<void a'
        't::native::index_kernel_impl<at::native::OpaqueType<(int)4>>(at::TensorIteratorBase &, c10::ArrayRef'
        '<long>, c10::ArrayRef<long>)::[lambda(char *, const char *, long) (instance 1)]>(at::TensorIteratorB'
        'ase &, c10::ArrayRef<long>, c10::ArrayRef<long>, const T1 &)::[lambda(int) (instance 1)]>(long, T3)',
        'void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, std::array<ch'
        'ar *, (unsigned long)1>>(int, T2, T3)',
    ],
    'other': [
        'void at_cuda_detail::cub::DeviceRadixSortSingleTileKernel<at_cuda_detail::cub::DeviceRadixSortPolicy'
        '<long, at::cuda::cub::detail::OpaqueType<(int)8>, unsigned long long>::Policy900, (bool)0, long, at:'
        ':cuda::cub::detail::OpaqueType<(int)8>, unsigned long long, at_cuda_detail::cub::detail::identity_de'
        'composer_t>(const T3 *, T3 *, const T4 *, T4 *, T5, int, int, T6)',
    ],
}


def kern_sum_names(path: Path) -> list[str]:
    """The Name column of every cuda_gpu_kern_sum table in nsys stats' text output (the last column: from the
    last run of dashes in the rule under the header to the end of the line)."""
    lines, names, in_kernels = path.read_text(encoding="utf-8").splitlines(), [], False
    for i, line in enumerate(lines):
        if line.strip().startswith("** "):
            in_kernels = "(cuda_gpu_kern_sum)" in line
        if in_kernels and line.strip().startswith("-----") and "Name" in lines[i - 1]:
            start = line.rstrip().rfind(" ") + 1
            for row in lines[i + 1:]:
                if not row.strip():
                    break
                names.append(row[start:].strip())
    return names


def sqlite_kernel_names(path: Path) -> set[str]:
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
        return {name for (name,) in db.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                               "JOIN StringIds s ON k.demangledName = s.id")}


def expected(listing: dict[str, list[str]]) -> dict[str, str]:
    return {name: category for category, names in listing.items() for name in names}


def test_every_kernel_name_of_the_2026_text_reports_gets_its_category():
    found = {name for report in TEXT_REPORTS for name in kern_sum_names(realdata(report))}
    assert len(found) > 60  # the parser found the tables
    listed = expected(NSYS_2026_TEXT_NAMES)
    assert found == set(listed)  # nothing unlisted, nothing listed that is not there
    assert {name: kt.classify_kernel(name) for name in found} == {name: listed[name] for name in found}


def test_every_kernel_name_of_the_sqlite_export_gets_its_category():
    found = sqlite_kernel_names(realdata(SQLITE))
    listed = expected(SQLITE_KERNEL_NAMES)
    assert found == set(listed)
    assert {name: kt.classify_kernel(name) for name in found} == {name: listed[name] for name in found}


# ---- the student's SQLite export through kernel_tables.py ----


def nvtx_ranges(path: Path) -> list[tuple[str, int, int]]:
    """(name, start, end) of every push/pop range (eventType 59), read from the export directly."""
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT COALESCE(e.text, s.value), e.start, e.end FROM NVTX_EVENTS e "
                          "LEFT JOIN StringIds s ON e.textId = s.id WHERE e.eventType = 59").fetchall()
    return [(name, start, end) for name, start, end in rows if end is not None]


def test_the_export_reads_with_every_operation_launched_as_nsys_stats_counted_them():
    """The text nsys stats 2024.6.2 printed for the same program (another run of it): 16,842 cudaLaunchKernel
    and 190 cuLaunchKernel calls, 1,510 cudaMemsetAsync, 272 cudaMemcpyAsync; 15 Forward and 5 Backward ranges."""
    profile = kt.load_nsys(realdata(SQLITE))
    names = [a.name for a in profile.activities]
    assert len(names) == 16842 + 190 + 1510 + 272 and profile.notes == []  # each joined to its launch
    assert names.count("[CUDA memset]") == 1510 and sum(n.startswith("[CUDA memcpy ") for n in names) == 272
    stats = realdata("rtx3070ti_train_nsys2024.6.2_stats.txt").read_text()
    for name, count in (("Forward", 15), ("Backward", 5)):
        assert re.search(rf"\s{count}\s.*PushPop\s+:{name}\s*$", stats, re.MULTILINE)
        assert [r.name for r in profile.ranges].count(name) == count


def test_the_kernel_time_is_what_the_real_nsys_stats_reads_from_the_same_export(tmp_path: Path):
    nsys, reason = find_real_nsys()
    if nsys is None:
        pytest.skip(reason)
    sqlite = realdata(SQLITE)
    subprocess.run([str(nsys), "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--output",
                    str(tmp_path / "x"), str(sqlite)], capture_output=True, check=True, timeout=300)
    rows = (tmp_path / "x_cuda_gpu_kern_sum.csv").read_text().splitlines()[1:]
    total_ns, instances = (sum(int(row.split(",")[i]) for row in rows) for i in (1, 2))  # numeric, never quoted
    kernels = [a for a in kt.load_nsys(sqlite).activities if not a.name.startswith("[CUDA mem")]
    assert (len(kernels), sum(a.duration_ns for a in kernels)) == (instances, total_ns)


def test_table_1_is_filled_from_the_students_own_ranges(tmp_path: Path):
    sqlite = realdata(SQLITE)
    assert kt.main([str(sqlite), "--md", str(tmp_path / "tables.md"), "--stopwatch", "forward=66.8"]) == 0
    profile = kt.load_nsys(sqlite)
    tables = kt.build_tables(profile, {"forward": 66.8}, stopwatch_source="your stopwatch")
    (forward,) = tables["phases"]  # the student's Backward ranges are all inside warm-up steps
    assert forward["phase"] == "forward" and tables["steps"] == 10
    # independently, from the export itself: the 'Forward' ranges outside every 'Warm-up...' range
    ranges = nvtx_ranges(sqlite)
    warmups = [(s, e) for name, s, e in ranges if name.lower().startswith("warm-up")]
    measured = [e - s for name, s, e in ranges if name == "Forward" and not any(a <= s <= b for a, b in warmups)]
    assert len(measured) == 10 and forward["range_ms"] == pytest.approx(statistics.fmean(measured) / 1e6, rel=1e-9)
    assert forward["agrees"] == "yes"  # the student's own stopwatch figure, given with --stopwatch
    text = (tmp_path / "tables.md").read_text()
    assert "ranges used: forward = 'Forward' x10 (left out, inside warm-up ranges: 5 forward, 5 backward)" in text
    assert "| forward |" in text and "### 3. Category shares" in text
    # every kernel, memcpy and memset read has the category listed above (nsys names the copies)
    listed = {**expected(SQLITE_KERNEL_NAMES), "[CUDA memcpy Host-to-Device]": "memory copy/set",
              "[CUDA memcpy Device-to-Device]": "memory copy/set", "[CUDA memset]": "memory copy/set"}
    names = {activity.name for activity in profile.activities}
    assert names <= set(listed) and {n: kt.classify_kernel(n) for n in names} == {n: listed[n] for n in names}
    no_stopwatch = kt.render_tables(kt.build_tables(profile))
    assert re.search(r"\| forward +\| +[0-9.]+ \| no stopwatch record +\|", no_stopwatch)


def test_a_students_outer_measure_range_counts_no_warm_up_work():
    """The student's 'Run Benchmark' range holds their model's set-up and warm-up steps too: named as the measured
    region, its warm-up work is still left out, as without it."""
    sqlite = realdata(SQLITE)
    tables = kt.build_tables(kt.load_nsys(sqlite), ranges={"forward": "Forward", "measure": "Run Benchmark"})
    ranges = nvtx_ranges(sqlite)
    within = lambda t, name: any(s <= t <= e for n, s, e in ranges if n.lower().startswith(name))  # noqa: E731
    with sqlite3.connect(f"{sqlite.resolve().as_uri()}?mode=ro", uri=True) as db:  # each launch's time, by hand
        launched = dict(db.execute("SELECT correlationId, start FROM CUPTI_ACTIVITY_KIND_RUNTIME"))
        work = [(end - start, launched[corr]) for table in ("KERNEL", "MEMCPY", "MEMSET") for start, end, corr in
                db.execute(f"SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_{table}")]
    measured_ns = sum(d for d, at in work if within(at, "run benchmark") and not within(at, "warm-up"))
    (all_row,) = [row for row in tables["categories"] if row["scope"] == "all"]
    assert tables["steps"] == 10 and all_row["ms_per_step"] == pytest.approx(measured_ns / 1e6 / 10, rel=1e-9)
    assert all_row["ms_per_step"] < 75  # the warm-up's 1,094 ms would add 109 ms per step


# ---- the student's memory snapshots through --analyze ----


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_a_students_snapshot_names_the_students_own_lines(name: str, tmp_path: Path, capsys):
    snapshot = realdata(name)
    assert mem_profile.main(["--analyze", str(snapshot), "--results-dir", str(tmp_path), "--out", "s"]) == 0
    assert f"code under {STUDENT_ROOT}" in capsys.readouterr().err
    (record,) = read_records(tmp_path / "memory" / "s.jsonl")
    assert record["snapshot_code_root"] == STUDENT_ROOT  # found from the frames, never given
    live = [row for row in record["snapshot_live_at_peak"] if row["count"]]  # the sites (not the totals rows)
    assert live and all(row["site"].startswith("cs336_basics/") or "no Python frame" in row["site"] for row in live)
    assert any(row["site"] == "cs336_basics/modules/softmax.py:14 forward" for row in live)
    largest = " ".join(row["sites"] for row in record["snapshot_largest"])
    assert "outside the project" not in largest and "cs336_basics/modules/linear.py:36 forward" in largest
    if "train" in name:  # backward runs in autograd's C++ thread: named by its node, not one catch-all row
        assert "BmmBackward0 > bmm (no Python frame" in largest and "(no Python frame: autograd backward" not in largest


def test_code_root_chooses_whose_lines_are_named(tmp_path: Path):
    snapshot = realdata(SNAPSHOTS[1])
    root = f"{STUDENT_ROOT}/cs336_basics"
    assert mem_profile.main(["--analyze", str(snapshot), "--results-dir", str(tmp_path), "--out", "s",
                             "--code-root", root]) == 0
    (record,) = read_records(tmp_path / "memory" / "s.jsonl")
    assert record["snapshot_code_root"] == root
    assert any(row["site"] == "modules/softmax.py:14 forward" for row in record["snapshot_live_at_peak"])
