// ps1's second kernel, shared by both cores' modules (ps1.cu, ps1_wg.cu).
// Needs HK. Merges partial rows: reduce item m = (q_start, q_end, part_base,
// n_parts); final row i merges part rows part_base + k*(q_end-q_start) +
// (i-q_start). grid (n_items, HK), block 128; may be launched as a
// programmatic dependent of ps1_fwd (common/pdl.cuh): the item is read
// before the forward ends.
#pragma once
#include "common/merge.cuh"
#include "common/mla_dims.cuh"
#include "common/pdl.cuh"

extern "C" __global__ void __launch_bounds__(128)
    ps1_reduce(const float* __restrict__ part_o, const float* __restrict__ part_lse,
               const int* __restrict__ reduce_items, __nv_bfloat16* __restrict__ o, float* __restrict__ lse) {
  using namespace mla;
  const int* it = reduce_items + 4ll * blockIdx.x;
  const int q_start = it[0], q_end = it[1], base = it[2], n = it[3];
  const int h = blockIdx.y;
  const long long nr = q_end - q_start;
  pdl_wait_primary();
  for (int i = q_start; i < q_end; ++i) {
    const long long p0 = (base + (i - q_start)) * static_cast<long long>(HK) + h;
    merge_row_f32(part_o + p0 * D_V, nr * HK * D_V, part_lse + p0, nr * HK, n, ninf(),
                  o + (static_cast<long long>(i) * HK + h) * D_V, lse + static_cast<long long>(i) * HK + h);
  }
}
