// DeepSeek-V4 native-FP8 decode: the attention core shared by v4_split.cu and
// hca_persist.cu. One CTA (256 threads, 8 warps) computes HG heads of one row
// over a contiguous range of that row's KV list.
//
// Why this shape: 128 heads x 1024 MAC per token against 576 bytes makes the
// problem tensor-core bound, so K/V tiles are dequantized once into shared
// memory (fp8 * 2^k is exact in bf16) and fed to mma.sync m16n8k16. The f32
// O accumulator for HG=64 heads x 512 dims is 128 registers per thread, so a
// warp owns 32 heads x DS dims of O (each K/V fragment feeds two m16 tiles,
// which halves the shared-memory reads per MAC) and computes the QK product
// only over those DS dims (a k-split). The partial logits meet in shared
// memory; each warp reduces and soft-maxes a slice of rows (fixed summation
// order) and writes bf16 P, which every warp then reads as its A operand.
// Per 32-token tile there are two barrier-separated phases: A = P.V of the
// previous tile interleaved with Q.K of this one (two independent mma
// streams), B = softmax of this tile interleaved with the dequant of the next
// and the cp.async of the one after; one CTA per SM has only 2 warps per
// scheduler, so the overlap has to come from inside each warp.
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
constexpr int NWARPS = 8;
constexpr int THREADS = NWARPS * 32;
constexpr int MH = HG < 32 ? HG : 32;    // heads per warp (O rows)
constexpr int MT = MH / 16;              // m16 tiles per warp
constexpr int WH = HG / MH;              // warps along heads
constexpr int NSL = NWARPS / WH;         // warps along dims (k-split of QK)
constexpr int DS = 512 / NSL;            // dims per warp
constexpr int BN = 32;                   // tokens per tile
constexpr int RS = MH / NSL;             // softmax rows per warp
constexpr int LPR = 32 / RS;             // lanes per softmax row
constexpr int TPL = BN / LPR;            // logits per lane
constexpr int D = 512, DNOPE = 448, DROPE = 64;
constexpr int ROWB = D * 2 + 16;         // bf16 row in smem, padded against bank conflicts
constexpr int RAWB = 464 + 128;          // staged bytes per token: nope + scales, rope
constexpr int XS = BN + 8;               // partial-logit row stride (floats): conflict-free float2 stores
constexpr int PSB = BN * 2 + 16;         // P row stride (bytes): conflict-free ldmatrix
constexpr int SM_Q = 0;
constexpr int SM_KV = SM_Q + HG * ROWB;            // 2 bf16 tiles
constexpr int SM_RAW = SM_KV + 2 * BN * ROWB;      // 2 raw tiles (cp.async)
constexpr int SM_XCH = SM_RAW + 2 * BN * RAWB;     // [NSL][HG][XS] partial logits
constexpr int SM_P = SM_XCH + NSL * HG * XS * 4;   // [HG][PSB] bf16 probabilities
constexpr int SM_ALPHA = SM_P + HG * PSB;          // [HG] rescale of this tile
constexpr int SM_ML = SM_ALPHA + HG * 4;           // [HG][2] final m (log2), l
constexpr int SM_MISC = SM_ML + HG * 8;
constexpr int SMEM_BYTES = SM_MISC + 1024;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

static_assert(NSL * WH == NWARPS && RS * NSL == MH && TPL * LPR == BN, "warp grid");
static_assert(DS % 16 == 0 && (TPL == 2 || TPL == 4 || TPL == 8), "tile shapes");
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");

struct Src {
  const unsigned char* q_packed;   // [rows, HK, 512]
  const __nv_bfloat16* q_rope;     // [rows, HK, 64]
  const unsigned char* pool_packed;// [P, 512]
  const __nv_bfloat16* pool_rope;  // [P, 64]
  const int* kv_indices;
  float scale_log2;                // sm_scale * log2(e)
};

// Unnormalized output of one warp's MH heads x DS dims (mma C fragments);
// the softmax state m (log2 domain) and l of each row ends in smem SM_ML.
struct Acc {
  float o[MT][DS / 8][4];
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

// Q of heads h0..h0+HG of one row, step 1: the packed rows' nope and scale
// bytes by cp.async into the bf16 tile area (free until the first tile is
// dequantized; 512-byte rows), the rope straight into place. Q's loads then
// cost one round trip, beside the first tiles', where a load-then-store loop
// waited for one per two chunks a thread (7 at 64 heads); an item reads Q
// once, and short items are mostly Q.
__device__ __forceinline__ void issue_q(char* sm, const Src& s, int row, int h0) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const unsigned char* qp = s.q_packed + ((size_t)row * HK + h0 + w) * D + lane * 16;
  const unsigned raw = smem_u32(sm + SM_KV) + w * D + lane * 16;
  // Warp w copies heads w, w + 8, ...; lane = chunk (29 of 32 lanes busy).
  if (lane < 29) {
#pragma unroll
    for (int k = 0; k < HG / NWARPS; ++k) cp_async16(raw + k * NWARPS * D, qp + (size_t)k * NWARPS * D, 16);
  }
  const int hr = tid >> 3, cr = tid & 7;
  const __nv_bfloat16* qr = s.q_rope + ((size_t)row * HK + h0 + hr) * DROPE + cr * 8;
  const unsigned qs = smem_u32(sm + SM_Q) + hr * ROWB + DNOPE * 2 + cr * 16;
#pragma unroll
  for (int k = 0; k < (HG * 8 + THREADS - 1) / THREADS; ++k)
    if (hr + k * (THREADS / 8) < HG)
      cp_async16(qs + k * (THREADS / 8) * ROWB, qr + (size_t)k * (THREADS / 8) * DROPE, 16);
}
static_assert(HG % NWARPS == 0 && HG % (THREADS / 64) == 0, "Q copy mappings");
static_assert(HG * D <= 2 * BN * ROWB, "Q's packed rows fit the bf16 tile area");

// Step 2, once issue_q's group landed: the packed rows -> bf16 [HG][ROWB].
__device__ __forceinline__ void dequant_q(char* sm) {
  // Thread t dequantizes 8-byte chunk t % 64 (56 of 64 busy) of heads t / 64 + 4k.
  const int ch = threadIdx.x & 63, h = threadIdx.x >> 6;
  if (ch >= 56) return;
  const unsigned char* rp = reinterpret_cast<const unsigned char*>(sm + SM_KV) + h * D;
  char* qp = sm + SM_Q + h * ROWB + ch * 16;
#pragma unroll 4
  for (int k = 0; k < HG / (THREADS / 64); ++k) {
    const unsigned char* r = rp + k * (THREADS / 64) * D;
    const uint2 w = *reinterpret_cast<const uint2*>(r + ch * 8);
    const float sc = ue8m0(r[DNOPE + 2 * (ch >> 3)]);
    *reinterpret_cast<uint4*>(qp + k * (THREADS / 64) * ROWB) = dq8(w, sc);
  }
}

constexpr int TPT = THREADS / BN;  // threads per staged token

// Stages one token's packed bytes 0..464 (nope + scales, 29 chunks of 16) and
// its rope (8 chunks): thread (token tid/TPT, part tid%TPT) copies chunks
// part, part+TPT, ... of its token.
__device__ __forceinline__ void issue_tile(char* sm, const Src& s, int buf, int idx, bool valid) {
  const int tid = threadIdx.x, tk = tid / TPT, part = tid % TPT;
  const unsigned dst = smem_u32(sm + SM_RAW + (buf * BN + tk) * RAWB);
  const int nb = valid ? 16 : 0;
  const size_t row = valid ? (size_t)idx : 0;
  const unsigned char* gp = s.pool_packed + row * D;
  const unsigned char* gr = reinterpret_cast<const unsigned char*>(s.pool_rope + row * DROPE);
#pragma unroll
  for (int j = 0; j < (37 + TPT - 1) / TPT; ++j) {
    const int c = part + TPT * j;
    if (c < 29)
      cp_async16(dst + c * 16, gp + c * 16, nb);
    else if (c < 37)
      cp_async16(dst + c * 16, gr + (c - 29) * 16, nb);
  }
}

// Raw tile -> bf16 tile. Thread t owns token t/8 and the 8-byte column t%8 of
// each of the 7 scale tiles, so every shared-memory offset is a compile-time
// constant plus one per-thread base.
__device__ __forceinline__ void dequant_tile(char* sm, int buf) {
  const int tid = threadIdx.x, part = tid & 7;
  const char* rp = sm + SM_RAW + buf * BN * RAWB + (tid >> 3) * RAWB;
  char* kp = sm + SM_KV + buf * BN * ROWB + (tid >> 3) * ROWB;
#pragma unroll
  for (int j = 0; j < DNOPE / 64; ++j) {
    const uint2 w = *reinterpret_cast<const uint2*>(rp + j * 64 + part * 8);
    const float sc = ue8m0(static_cast<unsigned char>(rp[DNOPE + 2 * j]));
    *reinterpret_cast<uint4*>(kp + j * 128 + part * 16) = dq8(w, sc);
  }
  *reinterpret_cast<uint4*>(kp + DNOPE * 2 + part * 16) =
      *reinterpret_cast<const uint4*>(rp + 464 + part * 16);
}
static_assert(THREADS == BN * 8, "tile mapping: 8 threads per token");

__device__ __forceinline__ int tile_index(const Src& s, long long tok0, int ntok, int t) {
  const int p = t * BN + static_cast<int>(threadIdx.x) / TPT;
  return p < ntok ? __ldg(s.kv_indices + tok0 + p) : 0;
}

template <int N>
__device__ __forceinline__ void ld_logits(float (&v)[N], const float* p) {
  if constexpr (N == 8) {
    const float4 x = *reinterpret_cast<const float4*>(p), y = *reinterpret_cast<const float4*>(p + 4);
    v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w; v[4] = y.x; v[5] = y.y; v[6] = y.z; v[7] = y.w;
  } else if constexpr (N == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
  } else {
    const float2 x = *reinterpret_cast<const float2*>(p);
    v[0] = x.x; v[1] = x.y;
  }
}

template <int N>
__device__ __forceinline__ void st_probs(char* p, const float (&v)[N]) {
  if constexpr (N == 8) {
    *reinterpret_cast<uint4*>(p) = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]),
                                              pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
  } else if constexpr (N == 4) {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
  } else {
    *reinterpret_cast<unsigned*>(p) = pack_bf16(v[0], v[1]);
  }
}

// Per-thread state of one attend() call: the two pipeline phases below are
// members so they inline into one register-resident body.
struct Pipe {
  char* sm;
  const Src& s;
  Acc& acc;
  long long tok0;
  int ntok, tk, hw, g, t4, srow, q;
  unsigned q_addr, p_addr, k_off, v_off, kv0;
  float* xw;
  const float* xr;
  const float* alph;
  float m_run, l_run;
  int idx_next;

  // Phase A(i): O = O * alpha(i-1) + P(i-1) V(i-1) interleaved with the
  // partial logits of tile i, so two independent mma streams share the
  // tensor pipe; ends with this thread's copies of tile i+1 landed.
  template <bool PV, bool QK>
  __device__ __forceinline__ void phase_a(int i) {
    constexpr int NQ = DS / 16;  // QK k-steps; PV has BN/16 * NQ = 2 * NQ steps
    const unsigned kv_q = kv0 + (i & 1) * (BN * ROWB);
    const unsigned kv_v = kv0 + ((i + 1) & 1) * (BN * ROWB);
    if constexpr (PV) {
      float al[MT][2];
      bool one = true;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          al[mt][r] = alph[hw * MH + mt * 16 + g + 8 * r];
          one = one && al[mt][r] == 1.f;
        }
      if (!__all_sync(0xffffffffu, one)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < DS / 8; ++j) {
            acc.o[mt][j][0] *= al[mt][0]; acc.o[mt][j][1] *= al[mt][0];
            acc.o[mt][j][2] *= al[mt][1]; acc.o[mt][j][3] *= al[mt][1];
          }
      }
    }
    float sc[MT][BN / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) sc[mt][j][0] = sc[mt][j][1] = sc[mt][j][2] = sc[mt][j][3] = 0.f;
    unsigned pa[MT][4];
#pragma unroll
    for (int t = 0; t < NQ; ++t) {
      if constexpr (QK) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], q_addr + mt * 16 * ROWB + t * 32);
#pragma unroll
        for (int nb = 0; nb < BN / 16; ++nb) {
          unsigned b[4];
          ldsm_x4(b, kv_q + k_off + nb * 16 * ROWB + t * 32);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(sc[mt][2 * nb], a[mt], b[0], b[1]);
            mma_bf16(sc[mt][2 * nb + 1], a[mt], b[2], b[3]);
          }
        }
      }
      if constexpr (PV) {
#pragma unroll
        for (int uu = 0; uu < 2; ++uu) {
          const int u = 2 * t + uu, kc = u / NQ, nd = u % NQ;
          if (nd == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(pa[mt], p_addr + mt * 16 * PSB + kc * 32);
          }
          unsigned b[4];
          ldsm_x4_t(b, kv_v + v_off + kc * 16 * ROWB + nd * 32);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(acc.o[mt][2 * nd], pa[mt], b[0], b[1]);
            mma_bf16(acc.o[mt][2 * nd + 1], pa[mt], b[2], b[3]);
          }
        }
      }
    }
    if constexpr (QK) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          float* p = xw + (mt * 16 + g) * XS + j * 8 + 2 * t4;
          *reinterpret_cast<float2*>(p) = make_float2(sc[mt][j][0], sc[mt][j][1]);
          *reinterpret_cast<float2*>(p + 8 * XS) = make_float2(sc[mt][j][2], sc[mt][j][3]);
        }
    }
    cp_async_wait<0>();
  }

  // Phase B(i): reduce the NSL partials of this warp's RS rows (fixed order),
  // online softmax -> bf16 P(i) and alpha(i); meanwhile dequantize tile i+1
  // (into the buffer PV(i-1) just released) and start the copies of tile i+2.
  // Past the end these work on zero-filled or unused buffers, which keeps the
  // block free of branches so the scheduler can interleave them.
  __device__ __forceinline__ void phase_b(int i) {
    float v[TPL], u[TPL];
    ld_logits(v, xr);
#pragma unroll
    for (int k = 1; k < NSL; ++k) {
      ld_logits(u, xr + k * HG * XS);
#pragma unroll
      for (int e = 0; e < TPL; ++e) v[e] += u[e];
    }
    dequant_tile(sm, (i + 1) & 1);
    issue_tile(sm, s, i & 1, idx_next, (i + 2) * BN + tk < ntok);
    cp_async_commit();
    idx_next = tile_index(s, tok0, ntok, i + 3);
    float mx = V4_NEG_INF;
    const int tb = i * BN + q * TPL;
#pragma unroll
    for (int e = 0; e < TPL; ++e) {
      v[e] = tb + e < ntok ? v[e] * s.scale_log2 : V4_NEG_INF;
      mx = fmaxf(mx, v[e]);
    }
#pragma unroll
    for (int o = LPR / 2; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float mn = fmaxf(m_run, mx);
    const float msub = mn == V4_NEG_INF ? 0.f : mn;
    const float alpha = exp2f(m_run - msub);
    m_run = mn;
    float rs = 0.f;
#pragma unroll
    for (int e = 0; e < TPL; ++e) {
      v[e] = exp2f(v[e] - msub);
      rs += v[e];
    }
    l_run = l_run * alpha + rs;
    st_probs(sm + SM_P + srow * PSB + q * TPL * 2, v);
    if (q == 0) reinterpret_cast<float*>(sm + SM_ALPHA)[srow] = alpha;
  }
};

// Attention of heads h0..h0+HG of `row` over kv_indices[tok0 .. tok0+ntok).
// All 256 threads must call it; it begins with a barrier, so the caller may
// reuse shared memory right up to the call, and ends with one, after which
// SM_ML holds each row's m (log2 domain) and l.
__device__ __forceinline__ void attend(char* sm, const Src& s, int row, int h0, long long tok0,
                                       int ntok, Acc& acc) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hw = warp / NSL, sl = warp - hw * NSL;
  const int dim0 = sl * DS;
  const int tk = tid / TPT;
  const int g = lane >> 2, t4 = lane & 3;
  const int ntiles = (ntok + BN - 1) / BN;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < DS / 8; ++j) acc.o[mt][j][0] = acc.o[mt][j][1] = acc.o[mt][j][2] = acc.o[mt][j][3] = 0.f;
  // Softmax ownership: row srow (of the CTA's HG), logits q*TPL .. q*TPL+TPL.
  const int srow = hw * MH + sl * RS + lane / LPR;
  const int q = lane % LPR;

  __syncthreads();
  issue_q(sm, s, row, h0);
  {
    const int i0 = tile_index(s, tok0, ntok, 0), i1 = tile_index(s, tok0, ntok, 1);
    if (ntiles > 0) issue_tile(sm, s, 0, i0, tk < ntok);
    cp_async_commit();  // Q and tile 0
    if (ntiles > 1) issue_tile(sm, s, 1, i1, BN + tk < ntok);
    cp_async_commit();
  }
  int idx_next = tile_index(s, tok0, ntok, 2);
  cp_async_wait<1>();
  __syncthreads();
  dequant_q(sm);
  __syncthreads();  // Q's packed rows read before tile 0 lands on them
  if (ntiles > 0) dequant_tile(sm, 0);

  const int lrow = (lane & 7) + ((lane >> 3) & 1) * 8;  // ldmatrix row of an A tile
  Pipe pp{sm, s, acc, tok0, ntok, tk, hw, g, t4, srow, q,
          smem_u32(sm + SM_Q) + (hw * MH + lrow) * ROWB + (dim0 + (lane >> 4) * 8) * 2,
          smem_u32(sm + SM_P) + (hw * MH + lrow) * PSB + (lane >> 4) * 16,
          static_cast<unsigned>(((lane & 7) + (lane >> 4) * 8) * ROWB + (dim0 + ((lane >> 3) & 1) * 8) * 2),
          static_cast<unsigned>(lrow * ROWB + (dim0 + (lane >> 4) * 8) * 2),
          smem_u32(sm + SM_KV),
          reinterpret_cast<float*>(sm + SM_XCH) + (sl * HG + hw * MH) * XS,
          reinterpret_cast<const float*>(sm + SM_XCH) + srow * XS + q * TPL,
          reinterpret_cast<const float*>(sm + SM_ALPHA),
          V4_NEG_INF, 0.f, idx_next};
  if (ntiles > 0) {
    cp_async_wait<0>();
    __syncthreads();  // tile 0 in kv[0]; tile 1 landed
    pp.phase_a<false, true>(0);
    __syncthreads();
    pp.phase_b(0);
    for (int i = 1; i < ntiles; ++i) {
      __syncthreads();  // P(i-1), alpha(i-1), tile i in kv[i&1]
      pp.phase_a<true, true>(i);
      __syncthreads();
      pp.phase_b(i);
    }
    __syncthreads();
    pp.phase_a<true, false>(ntiles);
  }
  cp_async_wait<0>();
  float l_run = pp.l_run;
  const float m_run = pp.m_run;
#pragma unroll
  for (int o = LPR / 2; o >= 1; o >>= 1) l_run += __shfl_xor_sync(0xffffffffu, l_run, o);
  if (q == 0) {
    float* ml = reinterpret_cast<float*>(sm + SM_ML) + 2 * srow;
    ml[0] = m_run;
    ml[1] = l_run;
  }
  __syncthreads();
}

// f32 partial: o / l and lse = ln(sum e^s) (no sink); empty -> o = 0, lse = -inf.
__device__ __forceinline__ void store_partial(const char* sm, const Acc& acc, float* part_o,
                                              float* part_lse, long long slot, int h0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hw = warp / NSL, sl = warp - hw * NSL;
  const int g = lane >> 2, t4 = lane & 3;
  const float* ml = reinterpret_cast<const float*>(sm + SM_ML);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int hr = hw * MH + mt * 16 + g + 8 * r;
      const float m = ml[2 * hr], l = ml[2 * hr + 1];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int head = h0 + hr;
      float* op = part_o + (slot * HK + head) * D + sl * DS + 2 * t4;
#pragma unroll
      for (int j = 0; j < DS / 8; ++j)
        *reinterpret_cast<float2*>(op + j * 8) =
            make_float2(acc.o[mt][j][2 * r] * inv, acc.o[mt][j][2 * r + 1] * inv);
      if (sl == 0 && t4 == 0)
        part_lse[slot * HK + head] = l > 0.f ? (m + log2f(l)) * LN2 : V4_NEG_INF;
    }
}

// Final bf16 output of one row with the sink in the denominator.
__device__ __forceinline__ void store_final(const char* sm, const Acc& acc, __nv_bfloat16* o,
                                            float* lse, long long row, int h0, const float* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hw = warp / NSL, sl = warp - hw * NSL;
  const int g = lane >> 2, t4 = lane & 3;
  const float* ml = reinterpret_cast<const float*>(sm + SM_ML);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int hr = hw * MH + mt * 16 + g + 8 * r;
      const float m = ml[2 * hr], l = ml[2 * hr + 1];
      const int head = h0 + hr;
      const float sk = sink ? sink[head] * LOG2E : V4_NEG_INF;
      const float mf = fmaxf(m, sk);
      float f = 0.f, ls = V4_NEG_INF;
      if (mf != V4_NEG_INF) {
        const float a = exp2f(m - mf);
        const float lf = l * a + exp2f(sk - mf);
        f = a / lf;
        ls = (mf + log2f(lf)) * LN2;
      }
      unsigned* op = reinterpret_cast<unsigned*>(o + (row * HK + head) * D + sl * DS + 2 * t4);
#pragma unroll
      for (int j = 0; j < DS / 8; ++j)
        op[j * 4] = pack_bf16(acc.o[mt][j][2 * r] * f, acc.o[mt][j][2 * r + 1] * f);
      if (sl == 0 && t4 == 0) lse[row * HK + head] = ls;
    }
}

}  // namespace v4
