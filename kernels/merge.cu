// LSE-merge kernels (SPEC section 1 combine; section 2 sink). No defines.
// ABI: kernels/ABI.md.
#include "common/merge.cuh"

using namespace mla;

// Merges W ranks' (o, lse) per (row, head). grid (rows*H), block 64: each
// thread 8 of the 512 dims.
extern "C" __global__ void __launch_bounds__(64)
    dcp_combine(const __nv_bfloat16* __restrict__ o_r, const float* __restrict__ lse_r, int W, int rows, int H,
                __nv_bfloat16* __restrict__ o, float* __restrict__ lse) {
  const long long rh = blockIdx.x;
  const long long plane = static_cast<long long>(rows) * H;
  if (rh >= plane) return;
  const int d = threadIdx.x * 8;
  const float g = merge_lse(lse_r + rh, plane, W, -__int_as_float(0x7f800000));
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int r = 0; r < W; ++r) {
    const float w = merge_weight(lse_r[r * plane + rh], g);
    if (w == 0.f) continue;
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(o_r + (r * plane + rh) * 512 + d));
    const unsigned u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      acc[2 * k] += w * __uint_as_float(u[k] << 16);
      acc[2 * k + 1] += w * __uint_as_float(u[k] & 0xFFFF0000u);
    }
  }
  unsigned out[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    __nv_bfloat162 p = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
    out[k] = *reinterpret_cast<unsigned*>(&p);
  }
  *reinterpret_cast<uint4*>(o + rh * 512 + d) = make_uint4(out[0], out[1], out[2], out[3]);
  if (threadIdx.x == 0) lse[rh] = g;
}

// Row i merges slots split_indptr[i] .. split_indptr[i+1] of part_o
// [slots, H, 512]; `sink` ([H] or null) is a virtual key of value 0 added
// once. grid (rows*H), block 128.
extern "C" __global__ void __launch_bounds__(128)
    split_merge(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                const int* __restrict__ split_indptr, const float* __restrict__ sink, int rows, int H,
                __nv_bfloat16* __restrict__ o, float* __restrict__ lse) {
  const long long rh = blockIdx.x;
  if (rh >= static_cast<long long>(rows) * H) return;
  const long long i = rh / H;
  const int h = static_cast<int>(rh % H);
  const int s0 = split_indptr[i], n = split_indptr[i + 1] - s0;
  const float sk = sink ? sink[h] : -__int_as_float(0x7f800000);
  const long long p0 = static_cast<long long>(s0) * H + h;
  merge_row_f32(part_o + p0 * 512, static_cast<long long>(H) * 512, part_lse + p0, H, n, sk, o + rh * 512,
                lse + rh);
}
