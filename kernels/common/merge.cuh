// LSE merge (SPEC section 1, combine formula), shared by ps1's reduce,
// page64's stage 2, dcp_combine and split_merge so all four agree bit for bit
// on the weights.
#pragma once
#include <cuda_bf16.h>

namespace mla {

// Every read of a part's o or LSE. Not ld.global.nc (`__ldg`, or what NVVM
// makes of a const __restrict__ read): the merges run as programmatic
// dependents of their forward (pdl.cuh), and ptxas may move .nc loads, whose
// data is read-only for the whole kernel, above griddepcontrol.wait, ahead of
// the forward's writes. ld.global.ca keeps the LSEs' second pass in L1.
__device__ __forceinline__ float ld_part(const float* p) { return __ldca(p); }
__device__ __forceinline__ float4 ld_part4(const float* p) { return __ldca(reinterpret_cast<const float4*>(p)); }

// NaN and +inf LSEs mean "this part saw nothing".
__device__ __forceinline__ float lse_clean(float x) {
  return (x != x || x == __int_as_float(0x7f800000)) ? -__int_as_float(0x7f800000) : x;
}

// The max of m and parts r0..n-1's LSEs, LSE_BATCH loads a round trip (a
// reduce of 16 parts is latency-bound), and the sum of exp(lse_r - m) over
// the same parts added to `sum` in part order (L1 hits by then).
constexpr int LSE_BATCH = 8;
__device__ __forceinline__ float lse_max_from(const float* lse, long long stride, int r0, int n, float m) {
  const float ninf = -__int_as_float(0x7f800000);
  for (; r0 < n; r0 += LSE_BATCH) {
    float x[LSE_BATCH];
#pragma unroll
    for (int k = 0; k < LSE_BATCH; ++k) x[k] = r0 + k < n ? lse_clean(ld_part(lse + (r0 + k) * stride)) : ninf;
#pragma unroll
    for (int k = 0; k < LSE_BATCH; ++k) m = fmaxf(m, x[k]);
  }
  return m;
}
__device__ __forceinline__ float lse_sum_from(const float* lse, long long stride, int r0, int n, float m, float sum) {
  const float ninf = -__int_as_float(0x7f800000);
  for (int r = r0; r < n; ++r) {
    const float x = lse_clean(ld_part(lse + r * stride));
    if (x != ninf) sum += expf(x - m);
  }
  return sum;
}

// G = ln(sum_r exp(lse_r) + exp(sink)); `sink` = -inf when there is none.
// -inf when nothing contributes. Reads lse[r * stride], r < n; max and sum
// keep the order r = 0, 1, ...
__device__ __forceinline__ float merge_lse(const float* lse, long long stride, int n, float sink) {
  const float ninf = -__int_as_float(0x7f800000);
  const float s = lse_clean(sink);
  const float m = lse_max_from(lse, stride, 0, n, s);
  if (m == ninf) return ninf;
  return logf(lse_sum_from(lse, stride, 0, n, m, (s == ninf) ? 0.f : expf(s - m))) + m;
}

// merge_lse with parts 0..K-1's LSEs already loaded and cleaned (x[k],
// -inf past n), so a caller merging several heads sends all their loads
// out at once; the same max and the same sum in part order (the same bits).
template <int K>
__device__ __forceinline__ float merge_lse_from(const float (&x)[K], const float* lse, long long stride, int n,
                                                float sink) {
  const float ninf = -__int_as_float(0x7f800000);
  const float s = lse_clean(sink);
  float m = s;
#pragma unroll
  for (int k = 0; k < K; ++k) m = fmaxf(m, x[k]);
  m = lse_max_from(lse, stride, K, n, m);
  if (m == ninf) return ninf;
  float sum = (s == ninf) ? 0.f : expf(s - m);
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (x[k] != ninf) sum += expf(x[k] - m);
  return logf(lse_sum_from(lse, stride, K, n, m, sum)) + m;
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
    v0[k] = k < n ? ld_part4(po + k * po_stride + d) : make_float4(0.f, 0.f, 0.f, 0.f);
  const float g = merge_lse(pl, pl_stride, n, sink);
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  for (int r0 = 0; r0 < n; r0 += O_BATCH) {
    float w[O_BATCH];
    float4 v[O_BATCH];
#pragma unroll
    for (int k = 0; k < O_BATCH; ++k) {
      w[k] = r0 + k < n ? merge_weight(ld_part(pl + (r0 + k) * pl_stride), g) : 0.f;
      v[k] = r0 == 0 ? v0[k]
             : w[k] != 0.f ? ld_part4(po + (r0 + k) * po_stride + d)
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

// HB heads of one row (o rows 512 floats apart, LSEs adjacent), by a block
// of exactly 128 threads (4 of the 512 dims each), for rows of one or two
// parts: every head's first OB parts and LSEs go out at once, so a block
// waits one round trip for HB heads where merge_row_f32 takes one per head.
// Further parts are right but slow (the heads take turns). Each head's sums
// are merge_row_f32's, in the same order (the same bits). `nh` <= HB heads
// are real.
template <int HB>
__device__ __forceinline__ void merge_heads_f32(const float* __restrict__ po, long long po_stride,
                                                const float* __restrict__ pl, long long pl_stride, int n,
                                                const float (&sink)[HB], int nh, __nv_bfloat16* __restrict__ out,
                                                float* __restrict__ lse_out) {
  constexpr int OB = 2, LB = 2;
  const float ninf = -__int_as_float(0x7f800000);
  const int d = threadIdx.x * 4;
  float x[HB][LB];
  float4 v[HB][OB];
#pragma unroll
  for (int j = 0; j < HB; ++j) {
#pragma unroll
    for (int k = 0; k < LB; ++k) x[j][k] = j < nh && k < n ? lse_clean(ld_part(pl + j + k * pl_stride)) : ninf;
#pragma unroll
    for (int k = 0; k < OB; ++k)
      v[j][k] = j < nh && k < n ? ld_part4(po + j * 512 + k * po_stride + d)
                                : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float g[HB];
#pragma unroll
  for (int j = 0; j < HB; ++j) g[j] = j < nh ? merge_lse_from(x[j], pl + j, pl_stride, n, sink[j]) : ninf;
  float4 a[HB];
#pragma unroll
  for (int j = 0; j < HB; ++j) a[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int r0 = 0; r0 < n; r0 += OB) {
    float w[HB][OB];
#pragma unroll
    for (int j = 0; j < HB; ++j)
#pragma unroll
      for (int k = 0; k < OB; ++k)
        w[j][k] = j < nh && r0 + k < n ? merge_weight(ld_part(pl + j + (r0 + k) * pl_stride), g[j]) : 0.f;
    if (r0) {
#pragma unroll
      for (int j = 0; j < HB; ++j)
#pragma unroll
        for (int k = 0; k < OB; ++k)
          v[j][k] = w[j][k] != 0.f
                        ? ld_part4(po + j * 512 + (r0 + k) * po_stride + d)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < HB; ++j)
#pragma unroll
      for (int k = 0; k < OB; ++k) {
        if (w[j][k] != 0.f) {
          a[j].x += w[j][k] * v[j][k].x;
          a[j].y += w[j][k] * v[j][k].y;
          a[j].z += w[j][k] * v[j][k].z;
          a[j].w += w[j][k] * v[j][k].w;
        }
      }
  }
#pragma unroll
  for (int j = 0; j < HB; ++j) {
    if (j >= nh) break;
    __nv_bfloat162 lo = __floats2bfloat162_rn(a[j].x, a[j].y);
    __nv_bfloat162 hi = __floats2bfloat162_rn(a[j].z, a[j].w);
    uint2 pk;
    pk.x = *reinterpret_cast<unsigned*>(&lo);
    pk.y = *reinterpret_cast<unsigned*>(&hi);
    *reinterpret_cast<uint2*>(out + j * 512 + d) = pk;
    if (threadIdx.x == 0) lse_out[j] = g[j];
  }
}

}  // namespace mla
