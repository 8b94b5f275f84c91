// DeepSeek-V4 native-FP8 decode: the attention core shared by v4_split.cu and
// hca_persist.cu. One CTA (256 threads, 8 warps) computes HG heads of one row
// over a contiguous range of that row's KV list.
//
// Why this shape: 128 heads x 1024 MAC per token against 576 bytes makes the
// problem tensor-core bound, so K/V tiles are dequantized once into shared
// memory (fp8 * 2^k is exact in bf16) and fed to mma.sync m16n8k16. The f32
// O accumulator for HG=64 heads x 512 dims is 128 registers per thread, so
// each warp owns 16 heads x DS dims of O and computes the QK product only over
// those DS dims (a k-split); the partial logits are summed through shared
// memory in a fixed order so every warp of a head block sees identical bits.
#pragma once
#include <cuda_bf16.h>

#ifndef V4_HEADS
#error "define V4_HEADS (16, 32, 64 or 128)"
#endif
#if V4_HEADS != 16 && V4_HEADS != 32 && V4_HEADS != 64 && V4_HEADS != 128
#error "V4_HEADS must be 16, 32, 64 or 128"
#endif

#define V4_NEG_INF __int_as_float(0xff800000u)

namespace v4 {

constexpr int HK = V4_HEADS;             // heads in the tensors (row stride)
constexpr int HG = HK < 64 ? HK : 64;    // heads per CTA
constexpr int NGROUPS = HK / HG;         // head groups (a grid dimension)
constexpr int THREADS = 256;
constexpr int NWARPS = THREADS / 32;
constexpr int WH = HG / 16;              // warps along heads
constexpr int NSL = NWARPS / WH;         // warps along dims (k-split of QK)
constexpr int DS = 512 / NSL;            // dims per warp
constexpr int BN = 32;                   // tokens per tile
constexpr int D = 512, DNOPE = 448, DROPE = 64;
constexpr int ROWB = D * 2 + 16;         // bf16 row in smem, padded against bank conflicts
constexpr int RAWB = 464 + 128;          // staged bytes per token: nope + scales, rope
constexpr int SM_Q = 0;
constexpr int SM_KV = SM_Q + HG * ROWB;            // 2 bf16 tiles
constexpr int SM_RAW = SM_KV + 2 * BN * ROWB;      // 2 raw tiles (cp.async)
constexpr int SM_XCH = SM_RAW + 2 * BN * RAWB;     // partial logits, one block per warp
constexpr int SM_MISC = SM_XCH + NWARPS * 16 * BN * 4;
constexpr int SMEM_BYTES = SM_MISC + 1024;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

static_assert(NSL * WH == NWARPS, "warp grid");
static_assert(DS % 16 == 0, "dims per warp");
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");

struct Src {
  const unsigned char* q_packed;   // [rows, HK, 512]
  const __nv_bfloat16* q_rope;     // [rows, HK, 64]
  const unsigned char* pool_packed;// [P, 512]
  const __nv_bfloat16* pool_rope;  // [P, 64]
  const int* kv_indices;
  float scale_log2;                // sm_scale * log2(e)
};

// Unnormalized output and online-softmax state (log2 domain) of one warp's
// 16 heads x DS dims; m/l are for rows g and g+8 of the mma fragment.
struct Acc {
  float o[DS / 8][4];
  float m[2], l[2];
};

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
      "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// src_bytes = 0 zero-fills the 16 bytes without reading global memory.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// UE8M0 byte -> 2^(e-127); e = 0 is the subnormal 2^-127.
__device__ __forceinline__ float ue8m0(unsigned e) {
  return e ? __uint_as_float(e << 23) : __uint_as_float(0x00400000u);
}

// Two e4m3 bytes (low byte = lower element) times a power of two, as bf16x2.
// Exact: e4m3 has 3 mantissa bits; NaN stays NaN.
__device__ __forceinline__ unsigned dq2(unsigned v16, float s) {
  unsigned h;
  asm("{\n .reg .b16 t;\n cvt.u16.u32 t, %1;\n cvt.rn.f16x2.e4m3x2 %0, t;\n}\n"
      : "=r"(h)
      : "r"(v16));
  float lo, hi;
  asm("{\n .reg .f16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;\n}\n"
      : "=f"(lo), "=f"(hi)
      : "r"(h));
  return pack_bf16(lo * s, hi * s);
}

// Eight e4m3 bytes -> eight bf16 (16 bytes).
__device__ __forceinline__ uint4 dq8(uint2 w, float s) {
  uint4 r;
  r.x = dq2(w.x & 0xffffu, s);
  r.y = dq2(w.x >> 16, s);
  r.z = dq2(w.y & 0xffffu, s);
  r.w = dq2(w.y >> 16, s);
  return r;
}

// Q of heads h0..h0+HG of one row -> bf16 [HG][ROWB] in smem.
__device__ __forceinline__ void load_q(char* sm, const Src& s, int row, int h0) {
  const int tid = threadIdx.x;
  const unsigned char* qp = s.q_packed + ((size_t)row * HK + h0) * D;
#pragma unroll 2
  for (int c = tid; c < HG * 56; c += THREADS) {
    const int h = c / 56, ch = c - h * 56;
    const unsigned char* rp = qp + (size_t)h * D;
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(rp + ch * 8));
    const float sc = ue8m0(__ldg(rp + DNOPE + 2 * (ch >> 3)));
    *reinterpret_cast<uint4*>(sm + SM_Q + h * ROWB + ch * 16) = dq8(w, sc);
  }
  const __nv_bfloat16* qr = s.q_rope + ((size_t)row * HK + h0) * DROPE;
  for (int c = tid; c < HG * 8; c += THREADS) {
    const int h = c >> 3, ch = c & 7;
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(qr + h * DROPE + ch * 8));
    *reinterpret_cast<uint4*>(sm + SM_Q + h * ROWB + DNOPE * 2 + ch * 16) = v;
  }
}

// Stages one token's packed bytes 0..464 (nope + scales) and rope: thread
// (token tid/8, part tid%8) copies chunks part, part+8, ... of its token.
__device__ __forceinline__ void issue_tile(char* sm, const Src& s, int buf, int idx, bool valid) {
  const int tid = threadIdx.x, tk = tid >> 3, part = tid & 7;
  const unsigned dst = smem_u32(sm + SM_RAW + (buf * BN + tk) * RAWB);
  const int nb = valid ? 16 : 0;
  const size_t row = valid ? (size_t)idx : 0;
  const unsigned char* gp = s.pool_packed + row * D;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = part + 8 * j;
    if (c < 29) cp_async16(dst + c * 16, gp + c * 16, nb);
  }
  cp_async16(dst + 464 + part * 16,
             reinterpret_cast<const unsigned char*>(s.pool_rope + row * DROPE) + part * 16, nb);
}

// Raw tile -> bf16 tile: 32 tokens x 56 chunks of 8 nope bytes, then the rope.
__device__ __forceinline__ void dequant_tile(char* sm, int buf) {
  const int tid = threadIdx.x;
  const char* raw = sm + SM_RAW + buf * BN * RAWB;
  char* kv = sm + SM_KV + buf * BN * ROWB;
#pragma unroll
  for (int j = 0; j < (BN * 56) / THREADS; ++j) {
    const int c = tid + j * THREADS;
    const int tk = c / 56, ch = c - tk * 56;
    const char* rp = raw + tk * RAWB;
    const uint2 w = *reinterpret_cast<const uint2*>(rp + ch * 8);
    const float sc = ue8m0(static_cast<unsigned char>(rp[DNOPE + 2 * (ch >> 3)]));
    *reinterpret_cast<uint4*>(kv + tk * ROWB + ch * 16) = dq8(w, sc);
  }
  const int tk = tid >> 3, part = tid & 7;
  *reinterpret_cast<uint4*>(kv + tk * ROWB + DNOPE * 2 + part * 16) =
      *reinterpret_cast<const uint4*>(raw + tk * RAWB + 464 + part * 16);
}
static_assert((BN * 56) % THREADS == 0 && BN * 8 == THREADS, "tile mapping");

__device__ __forceinline__ int tile_index(const Src& s, long long tok0, int ntok, int t) {
  const int p = t * BN + (threadIdx.x >> 3);
  return p < ntok ? __ldg(s.kv_indices + tok0 + p) : 0;
}

// Attention of heads h0..h0+HG of `row` over kv_indices[tok0 .. tok0+ntok).
// All 256 threads must call it; it begins with a barrier, so the caller may
// reuse shared memory right up to the call.
__device__ __forceinline__ void attend(char* sm, const Src& s, int row, int h0, long long tok0,
                                       int ntok, Acc& acc) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hw = warp / NSL, sl = warp - hw * NSL;
  const int dim0 = sl * DS;
  const int tk = tid >> 3;
  const int ntiles = (ntok + BN - 1) / BN;
#pragma unroll
  for (int j = 0; j < DS / 8; ++j) acc.o[j][0] = acc.o[j][1] = acc.o[j][2] = acc.o[j][3] = 0.f;
  acc.m[0] = acc.m[1] = V4_NEG_INF;
  acc.l[0] = acc.l[1] = 0.f;

  __syncthreads();
  {
    const int i0 = tile_index(s, tok0, ntok, 0), i1 = tile_index(s, tok0, ntok, 1);
    if (ntiles > 0) issue_tile(sm, s, 0, i0, tk < ntok);
    cp_async_commit();
    if (ntiles > 1) issue_tile(sm, s, 1, i1, BN + tk < ntok);
    cp_async_commit();
  }
  int idx_next = tile_index(s, tok0, ntok, 2);
  load_q(sm, s, row, h0);
  cp_async_wait<1>();
  __syncthreads();
  if (ntiles > 0) dequant_tile(sm, 0);

  const unsigned q_addr = smem_u32(sm + SM_Q) + (hw * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ROWB +
                          (dim0 + (lane >> 4) * 8) * 2;
  const unsigned k_off = ((lane & 7) + (lane >> 4) * 8) * ROWB + (dim0 + ((lane >> 3) & 1) * 8) * 2;
  const unsigned v_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * ROWB + (dim0 + (lane >> 4) * 8) * 2;
  float4* xch_mine = reinterpret_cast<float4*>(sm + SM_XCH) + warp * (BN / 8) * 32;
  const float4* xch_blk = reinterpret_cast<const float4*>(sm + SM_XCH) + hw * NSL * (BN / 8) * 32;
  const int t4 = lane & 3;

  for (int i = 0; i < ntiles; ++i) {
    cp_async_wait<0>();
    __syncthreads();  // raw tile i+1 landed; everyone is done with tile i-1
    if (i + 1 < ntiles) dequant_tile(sm, (i + 1) & 1);
    if (i + 2 < ntiles) issue_tile(sm, s, i & 1, idx_next, (i + 2) * BN + tk < ntok);
    cp_async_commit();
    idx_next = tile_index(s, tok0, ntok, i + 3);

    const unsigned kv_base = smem_u32(sm + SM_KV + (i & 1) * BN * ROWB);
    float sc[BN / 8][4];
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < DS / 16; ++ks) {
      unsigned a[4];
      ldsm_x4(a, q_addr + ks * 32);
#pragma unroll
      for (int nb = 0; nb < BN / 16; ++nb) {
        unsigned b[4];
        ldsm_x4(b, kv_base + k_off + nb * 16 * ROWB + ks * 32);
        mma_bf16(sc[2 * nb], a, b[0], b[1]);
        mma_bf16(sc[2 * nb + 1], a, b[2], b[3]);
      }
    }
    if (NSL > 1) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
        xch_mine[j * 32 + lane] = make_float4(sc[j][0], sc[j][1], sc[j][2], sc[j][3]);
      __syncthreads();
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        float4 v = xch_blk[j * 32 + lane];
#pragma unroll
        for (int k = 1; k < NSL; ++k) {
          const float4 u = xch_blk[(k * (BN / 8) + j) * 32 + lane];
          v.x += u.x; v.y += u.y; v.z += u.z; v.w += u.w;
        }
        sc[j][0] = v.x; sc[j][1] = v.y; sc[j][2] = v.z; sc[j][3] = v.w;
      }
    }

    // Online softmax (log2 domain); columns past ntok are masked.
    float mx[2] = {V4_NEG_INF, V4_NEG_INF};
    const int tb = i * BN;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = tb + j * 8 + 2 * t4 + e < ntok;
        sc[j][e] = ok ? sc[j][e] * s.scale_log2 : V4_NEG_INF;
        sc[j][2 + e] = ok ? sc[j][2 + e] * s.scale_log2 : V4_NEG_INF;
        mx[0] = fmaxf(mx[0], sc[j][e]);
        mx[1] = fmaxf(mx[1], sc[j][2 + e]);
      }
    }
    float alpha[2], msub[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(acc.m[r], mx[r]);
      msub[r] = mn == V4_NEG_INF ? 0.f : mn;
      alpha[r] = exp2f(acc.m[r] - msub[r]);
      acc.m[r] = mn;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[j][e] = exp2f(sc[j][e] - msub[0]);
        sc[j][2 + e] = exp2f(sc[j][2 + e] - msub[1]);
        rs[0] += sc[j][e];
        rs[1] += sc[j][2 + e];
      }
    }
    acc.l[0] = acc.l[0] * alpha[0] + rs[0];
    acc.l[1] = acc.l[1] * alpha[1] + rs[1];
#pragma unroll
    for (int j = 0; j < DS / 8; ++j) {
      acc.o[j][0] *= alpha[0]; acc.o[j][1] *= alpha[0];
      acc.o[j][2] *= alpha[1]; acc.o[j][3] *= alpha[1];
    }

    // O += P V over this warp's dims; V is the same bf16 tile, read transposed.
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      unsigned a[4];
      a[0] = pack_bf16(sc[2 * kc][0], sc[2 * kc][1]);
      a[1] = pack_bf16(sc[2 * kc][2], sc[2 * kc][3]);
      a[2] = pack_bf16(sc[2 * kc + 1][0], sc[2 * kc + 1][1]);
      a[3] = pack_bf16(sc[2 * kc + 1][2], sc[2 * kc + 1][3]);
#pragma unroll
      for (int nd = 0; nd < DS / 16; ++nd) {
        unsigned b[4];
        ldsm_x4_t(b, kv_base + v_off + kc * 16 * ROWB + nd * 32);
        mma_bf16(acc.o[2 * nd], a, b[0], b[1]);
        mma_bf16(acc.o[2 * nd + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    acc.l[r] += __shfl_xor_sync(0xffffffffu, acc.l[r], 1);
    acc.l[r] += __shfl_xor_sync(0xffffffffu, acc.l[r], 2);
  }
}

// f32 partial: o / l and lse = ln(sum e^s) (no sink); empty -> o = 0, lse = -inf.
__device__ __forceinline__ void store_partial(const Acc& acc, float* part_o, float* part_lse,
                                              long long slot, int h0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hw = warp / NSL, sl = warp - hw * NSL;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = acc.l[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int head = h0 + hw * 16 + g + 8 * r;
    float* op = part_o + (slot * HK + head) * D + sl * DS + 2 * t4;
#pragma unroll
    for (int j = 0; j < DS / 8; ++j)
      *reinterpret_cast<float2*>(op + j * 8) =
          make_float2(acc.o[j][2 * r] * inv, acc.o[j][2 * r + 1] * inv);
    if (sl == 0 && t4 == 0)
      part_lse[slot * HK + head] = l > 0.f ? (acc.m[r] + log2f(l)) * LN2 : V4_NEG_INF;
  }
}

// Final bf16 output of one row with the sink in the denominator.
__device__ __forceinline__ void store_final(const Acc& acc, __nv_bfloat16* o, float* lse,
                                            long long row, int h0, const float* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hw = warp / NSL, sl = warp - hw * NSL;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = h0 + hw * 16 + g + 8 * r;
    const float sk = sink ? sink[head] * LOG2E : V4_NEG_INF;
    const float mf = fmaxf(acc.m[r], sk);
    float f = 0.f, ls = V4_NEG_INF;
    if (mf != V4_NEG_INF) {
      const float a = exp2f(acc.m[r] - mf);
      const float lf = acc.l[r] * a + exp2f(sk - mf);
      f = a / lf;
      ls = (mf + log2f(lf)) * LN2;
    }
    unsigned* op =
        reinterpret_cast<unsigned*>(o + (row * HK + head) * D + sl * DS + 2 * t4);
#pragma unroll
    for (int j = 0; j < DS / 8; ++j) op[j * 4] = pack_bf16(acc.o[j][2 * r] * f, acc.o[j][2 * r + 1] * f);
    if (sl == 0 && t4 == 0) lse[row * HK + head] = ls;
  }
}

}  // namespace v4
