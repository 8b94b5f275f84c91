// LSE merge (SPEC section 1, combine formula), shared by ps1's reduce,
// page64's stage 2, dcp_combine and split_merge so all four agree bit for bit
// on the weights.
#pragma once
#include <cuda_bf16.h>

namespace mla {

// NaN and +inf LSEs mean "this part saw nothing".
__device__ __forceinline__ float lse_clean(float x) {
  return (x != x || x == __int_as_float(0x7f800000)) ? -__int_as_float(0x7f800000) : x;
}

// G = ln(sum_r exp(lse_r) + exp(sink)); `sink` = -inf when there is none.
// -inf when nothing contributes. Reads lse[r * stride], r < n. The loads go
// out LSE_BATCH at a time, not one dependent round trip per part (a reduce
// of 16 parts is latency-bound); max and sum keep the order r = 0, 1, ...
constexpr int LSE_BATCH = 8;
__device__ __forceinline__ float merge_lse(const float* lse, long long stride, int n, float sink) {
  const float ninf = -__int_as_float(0x7f800000);
  const float s = lse_clean(sink);
  float m = s;
  for (int r0 = 0; r0 < n; r0 += LSE_BATCH) {
    float x[LSE_BATCH];
#pragma unroll
    for (int k = 0; k < LSE_BATCH; ++k) x[k] = r0 + k < n ? lse_clean(lse[(r0 + k) * stride]) : ninf;
#pragma unroll
    for (int k = 0; k < LSE_BATCH; ++k) m = fmaxf(m, x[k]);
  }
  if (m == ninf) return ninf;
  float sum = (s == ninf) ? 0.f : expf(s - m);
  for (int r = 0; r < n; ++r) {  // L1 hits now
    const float x = lse_clean(lse[r * stride]);
    if (x != ninf) sum += expf(x - m);
  }
  return logf(sum) + m;
}

// Weight of a part with LSE lse_r in a merge whose total is g. Exactly 0 for
// an empty part, and callers skip zero weights, so an empty part's o (even
// NaN) contributes nothing.
__device__ __forceinline__ float merge_weight(float lse_r, float g) {
  const float ninf = -__int_as_float(0x7f800000);
  const float x = lse_clean(lse_r);
  return (x == ninf || g == ninf) ? 0.f : expf(x - g);
}

// One (row, head) of f32 partials -> bf16 out, by a block of exactly 128
// threads (4 of the 512 dims each). Part r's o starts at po + r * po_stride.
__device__ __forceinline__ void merge_row_f32(const float* __restrict__ po, long long po_stride,
                                              const float* __restrict__ pl, long long pl_stride, int n,
                                              float sink, __nv_bfloat16* __restrict__ out,
                                              float* __restrict__ lse_out) {
  const int d = threadIdx.x * 4;
  // O_BATCH parts' loads in flight at once; accumulation stays in part order.
  // The first batch goes out with the LSE loads, not after the weights: one
  // round trip fewer for merges of up to O_BATCH parts (ps1's reduce at 2).
  constexpr int O_BATCH = 4;
  float4 v0[O_BATCH];
#pragma unroll
  for (int k = 0; k < O_BATCH; ++k)
    v0[k] = k < n ? __ldg(reinterpret_cast<const float4*>(po + k * po_stride + d)) : make_float4(0.f, 0.f, 0.f, 0.f);
  const float g = merge_lse(pl, pl_stride, n, sink);
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  for (int r0 = 0; r0 < n; r0 += O_BATCH) {
    float w[O_BATCH];
    float4 v[O_BATCH];
#pragma unroll
    for (int k = 0; k < O_BATCH; ++k) {
      w[k] = r0 + k < n ? merge_weight(pl[(r0 + k) * pl_stride], g) : 0.f;
      v[k] = r0 == 0 ? v0[k]
             : w[k] != 0.f ? __ldg(reinterpret_cast<const float4*>(po + (r0 + k) * po_stride + d))
                           : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < O_BATCH; ++k) {
      if (w[k] != 0.f) {
        a0 += w[k] * v[k].x;
        a1 += w[k] * v[k].y;
        a2 += w[k] * v[k].z;
        a3 += w[k] * v[k].w;
      }
    }
  }
  __nv_bfloat162 lo = __floats2bfloat162_rn(a0, a1);
  __nv_bfloat162 hi = __floats2bfloat162_rn(a2, a3);
  uint2 pk;
  pk.x = *reinterpret_cast<unsigned*>(&lo);
  pk.y = *reinterpret_cast<unsigned*>(&hi);
  *reinterpret_cast<uint2*>(out + d) = pk;
  if (threadIdx.x == 0) *lse_out = g;
}

}  // namespace mla
