// page64's second kernel, shared by both cores' modules (page64.cu,
// page64_wg.cu). Needs HK. Row i merges its n_splits slots of part_o
// [rows, n_splits, HK, 512]. grid (rows, HK), block 128; may be launched as
// a programmatic dependent of page64_fwd (common/pdl.cuh).
#pragma once
#include "common/merge.cuh"
#include "common/mla_dims.cuh"
#include "common/pdl.cuh"

extern "C" __global__ void __launch_bounds__(128)
    page64_merge(const float* __restrict__ part_o, const float* __restrict__ part_lse, int n_splits,
                 __nv_bfloat16* __restrict__ o, float* __restrict__ lse) {
  using namespace mla;
  const long long i = blockIdx.x;
  const int h = blockIdx.y;
  const long long p0 = i * n_splits * HK + h;
  pdl_wait_primary();
  merge_row_f32(part_o + p0 * D_V, static_cast<long long>(HK) * D_V, part_lse + p0, HK, n_splits, ninf(),
                o + (i * HK + h) * D_V, lse + i * HK + h);
}
