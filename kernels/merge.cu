// LSE-merge kernels (SPEC section 1 combine; section 2 sink) and the DCP step's
// Q layout and local combine on several GPUs. No defines.
// ABI: kernels/ABI.md.
#include "common/merge.cuh"
#include "common/pdl.cuh"

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
  pdl_wait_primary();  // the partials come from v4_split, launched before
  merge_row_f32(part_o + p0 * 512, static_cast<long long>(H) * 512, part_lse + p0, H, n, sk, o + rh * 512,
                lse + rh);
}

// split_merge for rows of at most two splits (the host's pick): a block
// merges SPLIT_MERGE_HEADS heads of a row, grid (rows * ceil(H / 4)), block
// 128, so the plan is read once for them and their partials are in flight
// together (a merge of one or two parts is a round trip for the plan, then
// one for the data). More splits take split_merge: there a block's heads
// would wait for each other's further parts one after another.
constexpr int SPLIT_MERGE_HEADS = 4;
extern "C" __global__ void __launch_bounds__(128)
    split_merge_h4(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                   const int* __restrict__ split_indptr, const float* __restrict__ sink, int rows, int H,
                   __nv_bfloat16* __restrict__ o, float* __restrict__ lse) {
  const int hb = (H + SPLIT_MERGE_HEADS - 1) / SPLIT_MERGE_HEADS;
  const long long blk = blockIdx.x;
  if (blk >= static_cast<long long>(rows) * hb) return;
  const long long i = blk / hb;
  const int h0 = static_cast<int>(blk % hb) * SPLIT_MERGE_HEADS, nh = min(SPLIT_MERGE_HEADS, H - h0);
  const int s0 = split_indptr[i], n = split_indptr[i + 1] - s0;
  float sk[SPLIT_MERGE_HEADS];
#pragma unroll
  for (int j = 0; j < SPLIT_MERGE_HEADS; ++j) sk[j] = sink && j < nh ? sink[h0 + j] : -__int_as_float(0x7f800000);
  const long long p0 = static_cast<long long>(s0) * H + h0;
  pdl_wait_primary();
  merge_heads_f32(part_o + p0 * 512, static_cast<long long>(H) * 512, part_lse + p0, H, n, sk, nh,
                  o + (i * H + h0) * 512, lse + i * H + h0);
}

// The DCP step on several GPUs (the engine's all-gathered Q): rank g's
// slice of the all-gather holds heads g*Hg .. (g+1)*Hg of every row.
// Writes the kernel's padded Q [rows, hk, U*16 bytes], zero past N*Hg heads.
// U: 16-byte units per head (576 elements of 1 or 2 bytes). grid (rows*hk),
// block 64.
extern "C" __global__ void __launch_bounds__(64)
    dcp_gather_q(const uint4* __restrict__ qg, int N, int rows, int Hg, int U, int hk, uint4* __restrict__ q) {
  const long long ih = blockIdx.x;
  if (ih >= static_cast<long long>(rows) * hk) return;
  const long long i = ih / hk;
  const int h = static_cast<int>(ih % hk);
  uint4* dst = q + ih * U;
  if (h >= N * Hg) {
    for (int u = threadIdx.x; u < U; u += 64) dst[u] = make_uint4(0u, 0u, 0u, 0u);
    return;
  }
  const uint4* src = qg + ((static_cast<long long>(h / Hg) * rows + i) * Hg + h % Hg) * U;
  for (int u = threadIdx.x; u < U; u += 64) dst[u] = __ldg(src + u);
}

// The local half of the combine vLLM's cp_lse_ag_out_rs does: with every
// rank's LSE gathered, scale this GPU's ranks' o by exp(lse_r - G) and lay
// them out by destination GPU, so a sum reduce-scatter leaves each GPU the
// merged o of its own H/N heads. o_loc holds the k local ranks (global
// ranks first .. first+k-1), lse_all all R ranks; padded heads (>= H) are
// left out. The GPU's own chunk also gets the merged LSE G. o_send is bf16
// (vLLM's) or, with send_f32, f32 for an f32 reduce-scatter. grid (rows*H),
// block 64: each thread 8 of the 512 dims.
extern "C" __global__ void __launch_bounds__(64)
    dcp_correct(const __nv_bfloat16* __restrict__ o_loc, const float* __restrict__ lse_all, int R, int first,
                int k, int rows, int hk, int H, int N, int chunk, int send_f32, void* __restrict__ o_send,
                float* __restrict__ lse_out) {
  const long long ih = blockIdx.x;
  if (ih >= static_cast<long long>(rows) * H) return;
  const long long i = ih / H;
  const int h = static_cast<int>(ih % H);
  const long long plane = static_cast<long long>(rows) * hk;
  const long long at = i * hk + h;
  const int d = threadIdx.x * 8;
  const float g = merge_lse(lse_all + at, plane, R, -__int_as_float(0x7f800000));
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int j = 0; j < k; ++j) {
    const float w = merge_weight(lse_all[(first + j) * plane + at], g);
    if (w == 0.f) continue;
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(o_loc + (j * plane + at) * 512 + d));
    const unsigned u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[2 * e] += w * __uint_as_float(u[e] << 16);
      acc[2 * e + 1] += w * __uint_as_float(u[e] & 0xFFFF0000u);
    }
  }
  const int hc = H / N;
  const long long dst = (static_cast<long long>(h / hc) * rows + i) * hc + h % hc;
  if (send_f32) {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(o_send) + dst * 512 + d);
    p[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    p[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  } else {
    unsigned out[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      __nv_bfloat162 p = __floats2bfloat162_rn(acc[2 * e], acc[2 * e + 1]);
      out[e] = *reinterpret_cast<unsigned*>(&p);
    }
    *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(o_send) + dst * 512 + d) =
        make_uint4(out[0], out[1], out[2], out[3]);
  }
  if (threadIdx.x == 0 && h / hc == chunk) lse_out[i * hc + h % hc] = g;
}

// The f32 reduce-scatter's result to the bf16 output, n values (a multiple
// of 8). grid-stride, block 256.
extern "C" __global__ void __launch_bounds__(256)
    dcp_to_bf16(const float* __restrict__ x, long long n, __nv_bfloat16* __restrict__ y) {
  for (long long j = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 8; j < n;
       j += static_cast<long long>(gridDim.x) * blockDim.x * 8) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + j));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x + j + 4));
    __nv_bfloat162 p[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                           __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
    *reinterpret_cast<uint4*>(y + j) =
        make_uint4(*reinterpret_cast<unsigned*>(&p[0]), *reinterpret_cast<unsigned*>(&p[1]),
                   *reinterpret_cast<unsigned*>(&p[2]), *reinterpret_cast<unsigned*>(&p[3]));
  }
}
