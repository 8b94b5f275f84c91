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
// -inf when nothing contributes. Reads lse[r * stride], r < n.
__device__ __forceinline__ float merge_lse(const float* lse, long long stride, int n, float sink) {
  const float ninf = -__int_as_float(0x7f800000);
  const float s = lse_clean(sink);
  float m = s;
  for (int r = 0; r < n; ++r) m = fmaxf(m, lse_clean(lse[r * stride]));
  if (m == ninf) return ninf;
  float sum = (s == ninf) ? 0.f : expf(s - m);
  for (int r = 0; r < n; ++r) {
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
  const float g = merge_lse(pl, pl_stride, n, sink);
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  for (int r = 0; r < n; ++r) {
    const float w = merge_weight(pl[r * pl_stride], g);
    if (w != 0.f) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(po + r * po_stride + d));
      a0 += w * v.x;
      a1 += w * v.y;
      a2 += w * v.z;
      a3 += w * v.w;
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
