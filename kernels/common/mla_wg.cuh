// The compute-bound MLA decode core (rows = heads x s_q >= 64), shared by
// ps1_wg.cu and page64_wg.cu: one CTA computes softmax(Q K^T) V for a block
// of 64 query rows over a token range, on bf16 wgmma.
//
// Why this shape: at 64+ rows per KV token MLA decode is bound by the tensor
// cores, and the mma.sync core (mla_core.cuh) makes one pass per 16-32 rows
// with small MMAs. Here 64 rows share every K/V tile, both products run on
// wgmma (64 rows per warpgroup instruction), and O (64 x 512 f32) is split
// over two consumer warpgroups by output dims: warpgroup w holds O[:, 256w,
// +256) in 128 registers per thread.
//
// Schedule ("seesaw", after FlashMLA's SM90 decode kernel): tiles of 64
// tokens come in pairs; tile 2p lives in buffer 0, tile 2p+1 in buffer 1.
// WG0 computes S0 = Q K0^T, WG1 S1 = Q K1^T, at the same time. WG0 soft-maxes
// S0 against the running max m, publishes m0 and its rescale, and starts
// O_L += P0 V0L while WG1 soft-maxes S1 against m0 and starts O_R += P1 V1R.
// Then each takes the other's P through shared memory: WG1 O_R += (P0 *
// scale1) V0R, WG0 O_L = O_L * scale1 + P1 V1L, and issues the next pair's
// Q K^T behind it. One warpgroup's softmax runs while the other's MMAs
// keep the tensor cores busy. P is stored in the tile's rope block (dims
// 512..575), free once that tile's Q K^T is done, so two 72 KB tiles and
// Q fit in shared memory.
//
// A third, producer warpgroup fills Q and the tiles, 128-byte swizzled as
// wgmma reads them, and completes them on mbarriers (common/mbarrier.cuh):
// consumers never wait on their own loads, and a freed buffer is refilled
// while the other is computed. setmaxnreg moves registers from the
// producer to the consumers. WG_SELF (page64, bf16): the producer leaves at
// once and each consumer warpgroup refills by TMA the groups it frees
// (refill), as FlashMLA's warpgroups do.
//
// fp8 (a8w8): Q and KV are e4m3 in memory. The producer loads them into
// registers before the buffer is free, converts them to f16 (every e4m3
// value is an exact f16) and stores them, so both products run on f16
// wgmma from the same layout; P is f16 too.
//
// DeepSeek-V4 native FP8 rows (WG_V4, with KV_FP8): 512 dims, K = V, so a
// tile is 8 column blocks and P gets its own two blocks; the producer
// (common/wg_v4.cuh) dequantizes each tile-scaled e4m3 block to bf16 and
// copies the bf16 rope, and both products run on bf16 wgmma.
//
// WG_PAIR (V4, 128 heads): the two head-group CTAs of a token range run as
// one 2-CTA cluster, each producer dequantizing half of every tile's tokens
// into both CTAs' buffers (common/wg_v4.cuh), so each tile is dequantized
// once instead of twice: the producer sets the V4 core's rate.
//
// WG_TMA (page64, bf16): a tile that is one whole page in range is copied
// by the tensor-memory accelerator, one instruction per column block from
// thread 0 of the consumer warpgroup that freed it (WG_SELF), instead of
// 4608 cp.async from a warpgroup; tiles
// that reach past the range keep cp.async, which zero-fills rows past the
// end (a page's tail may hold anything, and P = 0 times NaN is NaN).
//
// Defines: HK (kernel heads), KV_FP8 (0: bf16 Q and KV; 1: e4m3), WG_V4
// (optional, 1: V4 native rows), WG_PAIR (optional, 1: 2-CTA clusters),
// WG_TMA and WG_SELF (optional, both 1: whole 64-token pages by TMA, the
// consumers refilling the buffers, one pass a CTA).
#pragma once
#include <cuda_bf16.h>

#ifndef KV_FP8
#error "define KV_FP8: 0 for bf16 Q and KV, 1 for e4m3"
#endif
#ifndef WG_V4
#define WG_V4 0
#endif
#if WG_V4 && !KV_FP8
#error "WG_V4 rows are e4m3: define KV_FP8=1"
#endif
#ifndef WG_PAIR
#define WG_PAIR 0
#endif
#if WG_PAIR && !WG_V4
#error "WG_PAIR shares V4 tiles: define WG_V4=1"
#endif
#ifndef WG_TMA
#define WG_TMA 0
#endif
#if WG_TMA && KV_FP8
#error "WG_TMA copies bf16 pages: the e4m3 producer converts through registers"
#endif
#ifndef WG_SELF
#define WG_SELF 0
#endif
#if WG_SELF != WG_TMA
#error "whole pages by TMA are copied by the consumers: define WG_TMA and WG_SELF together"
#endif
// f16 operands for MLA's e4m3 (exact, one conversion); V4's tile scales
// need bf16's exponent range.
#define WG16_F16 (KV_FP8 && !WG_V4)

#include "common/fp8.cuh"
#include "common/mbarrier.cuh"
#include "common/mla_dims.cuh"
#include "common/ptx.cuh"
#include "common/wgmma16.cuh"

#ifndef HK
#error "define HK: kernel heads, a multiple of 16 from 16 to 128"
#endif
static_assert(HK % 16 == 0 && HK >= 16 && HK <= 128, "HK must be a multiple of 16 in 16..128");

namespace mla {
namespace wg {

constexpr int THREADS = 384;               // WG0, WG1 (consumers), WG2 (producer)
constexpr int BM = 64;                     // query rows per CTA
constexpr int BN = 64;                     // tokens per tile
constexpr int CB = 8192;                   // one 64-dim column block: 64 rows x 128 B
constexpr int QK_DIMS = WG_V4 ? 512 : D_QK;
constexpr int NCB = QK_DIMS / 64;          // column blocks per row: MLA 8 of V + 1 of rope; V4 8
constexpr int TILE = NCB * CB;             // 73728 (V4 65536)
constexpr int OFF_Q = 0;
constexpr int OFF_BUF = TILE;              // buffer b at OFF_BUF + b * TILE
// V4: P0, P1 in blocks of their own (MLA keeps P in each tile's rope block).
// No barrier frees them: WG0 writes the next P0 only past NB_SCALE1, which
// WG1 reaches after its P0 V0R completed, and WG1 the next P1 only past
// NB_SCALE0, after WG0's P1 V1L.
constexpr int OFF_P = 3 * TILE;
constexpr int OFF_M = OFF_P + (WG_V4 ? 2 * CB : 0);  // running max per row (f32)
constexpr int OFF_SC0 = OFF_M + BM * 4;    // WG0's rescale of the pair
constexpr int OFF_SC1 = OFF_SC0 + BM * 4;  // WG1's rescale of the pair
constexpr int OFF_L = OFF_SC1 + BM * 4;    // both warpgroups' row sums at the end
constexpr int OFF_BAR = OFF_L + 2 * BM * 4;
constexpr int BAR_FULL = 0;                // [2][NCB]: column block of a buffer landed
constexpr int BAR_EMPTY = 2 * NCB;         // [2][2]: a buffer's first / second group of blocks is free
constexpr int CTAS = 1 + WG_PAIR;          // CTAs whose consumers read (and free) each buffer
constexpr int BAR_QFULL = BAR_EMPTY + 4;
constexpr int BAR_QEMPTY = BAR_QFULL + 1;
constexpr int N_BARS = BAR_QEMPTY + 1;
constexpr int SMEM_BYTES = OFF_BAR + N_BARS * 8 + 1024;  // + slack to align the base to 1024
static_assert(SMEM_BYTES <= 232448, "fits the sm_90 opt-in shared memory");

// Named barriers between the two consumer warpgroups (256 threads).
constexpr int NB_SCALE0 = 1, NB_SCALE1 = 2, NB_P0 = 3, NB_P1 = 4, NB_L = 5;
constexpr int CONSUMERS = 256;

// wgmma descriptor of V as the MN-major B operand: rows of 128 bytes (64
// dims) per token, swizzled as the K-major tile; 8 tokens per 1024-byte atom
// (SBO), the next 64 dims one column block further (LBO).
__device__ __forceinline__ unsigned long long desc_v(unsigned addr) {
  return static_cast<unsigned long long>((addr >> 4) & 0x3FFFu) | (static_cast<unsigned long long>(CB >> 4) << 16) |
         (64ull << 32) | (1ull << 62);
}

// The order a buffer's column blocks are loaded and multiplied in: the
// group its consumers free first (the V half of the first P V on it) comes
// first, so its refill starts while the other group is still being read.
// Buffer 0: V0L (blocks 0-3) is freed by WG0's P0 V0L, then 4-8 by WG1's
// P0 V0R (block 8 holds P0). Buffer 1: V1R (4-7) by WG1's P1 V1R, then 0-3
// and 8 (P1) by WG0's P1 V1L.
constexpr int GROUP_A = 4;  // blocks in the first group
// e4m3 (V4 and MLA fp8): WG1 multiplies P0 V0R before P1 V1R, so buffer 0
// (WG0's next S0, which the next pair's softmax waits on) is refilled first,
// and the producer refills 0A, 0B, 1A, 1B; WG1's next S1 has WG0's softmax
// as slack. bf16 keeps P1 V1R first (0A, 1A, 0B, 1B): measured, this order
// made hca_persist's long 128-head lists 4.7-8.5% and MLA fp8's page64 rows
// 2.0-2.9% faster, MLA bf16's H96 s_q 8 page64 2-3% slower
// (docs/kernels.md).
constexpr bool V0R_FIRST = KV_FP8;
__host__ __device__ constexpr int block_at(int b, int i) { return b == 0 || i == 8 ? i : (i < 4 ? i + 4 : i - 4); }
__device__ __forceinline__ unsigned empty_bar(unsigned bars, int b, int g) { return bars + 8 * (BAR_EMPTY + 2 * b + g); }

// One 64-row block over tokens [t0, t_end) of one sequence. Row r's mask
// limit and output row come from the caller's Rows (lim(r), o_row(r)).
struct Pass {
  long long q_row0;  // first Q row ([*, 576])
  int nrows;         // real rows, 1..64
  int t0, t_end;     // tokens streamed
  const int* idx;    // the sequence's pool entries (token rows or pages)
  bool prefetch;     // pull each next pair into L2 (prefetch_pair)
  int pf_n = 1, pf_k = 0;  // pf_n row blocks share this KV; this one prefetches pairs pf_k + i * pf_n
  const void* pages = nullptr;  // WG_TMA: the pool's tensor map (a kernel parameter)
};

// A CUtensorMap passed by value (`const __grid_constant__`): the pool as
// [rows, 576] bf16, boxes of 64 dims x 64 tokens, 128-byte swizzle.
struct alignas(64) TileMap {
  unsigned long long w[16];
};

// Loads and pairs issued so far: every role counts them the same way, so
// each knows the parity of every barrier phase.
struct Phase {
  unsigned items = 0;
  unsigned pairs = 0;
};

// Bytes of one Q or KV row in memory.
constexpr int ROW_BYTES = WG_V4 ? 512 : D_QK * (KV_FP8 ? 1 : 2);

// Pulls [p, p + BYTES) into L2, one prefetch per 128 bytes: every line of
// the row when p is 128-byte aligned (V4 rows, ropes) or 64-byte aligned
// with BYTES % 128 in 1..64 (576-byte e4m3 rows). Per-thread addresses: the bulk
// prefetch (cp.async.bulk.prefetch.L2) takes uniform operands, so a warp
// issues it once per lane in a loop, and for the e4m3 producers, which are
// the limit, that loop cost more than these few instructions.
template <int BYTES>
__device__ __forceinline__ void prefetch_lines(const unsigned char* p) {
#pragma unroll
  for (int o = 0; o < BYTES; o += 128) asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(p + o));
}

// Pulls pair pr's KV rows into L2, one row per producer thread (p = 0..127
// is the token of the pair): issued a pair ahead, a refill then waits on an
// L2 hit instead of DRAM, and the prefetch holds no registers or buffer.
// Of the row blocks that read the same KV, one prefetches each pair: when
// all did, the redundant requests kept the L2 86% busy at H96 s_q 8.
// The caller turns it off where one row block streams its KV alone at
// bf16: there the core runs near the memory bandwidth and the prefetch
// measured slower (docs/kernels.md).
template <int PAGE>
__device__ __forceinline__ void prefetch_pair(const Pass& ps, int pr, int p, const unsigned char* __restrict__ kv) {
  const int t = ps.t0 + 2 * pr * BN + p;
  if (!ps.prefetch || (ps.pf_n > 1 && pr % ps.pf_n != ps.pf_k) || t >= ps.t_end) return;
  const int e = PAGE == 1 ? __ldg(ps.idx + t) : __ldg(ps.idx + (t >> 6)) * 64 + (t & 63);
  const unsigned char* row = kv + static_cast<long long>(e) * ROW_BYTES;
  if (KV_FP8) {
    prefetch_lines<ROW_BYTES>(row);
  } else {  // 9 lines a row: per line measured 2-27% slower than the bulk loop
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(row), "n"(ROW_BYTES) : "memory");
  }
}

// Pool rows of a producer thread's 4 tokens tg + 16k of the tile at token
// tb (-1: past the range).
template <int PAGE>
__device__ __forceinline__ void tile_rows(const Pass& ps, int tb, int tg, int (&e)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int t = tg + 16 * k;
    e[k] = -1;
    if (tb + t < ps.t_end) e[k] = PAGE == 1 ? __ldg(ps.idx + tb + t) : __ldg(ps.idx + (tb >> 6)) * 64 + t;
  }
}

__device__ __forceinline__ int n_pairs(const Pass& ps) {
  const int n = ps.t_end - ps.t0;
  return n > 0 ? (n + 2 * BN - 1) / (2 * BN) : 0;
}

// Whether the tile at token tb (a multiple of 64 on page64) comes by TMA:
// with WG_TMA, one whole page in range. `refill` copies by this rule and
// the consumers fence the other tiles' cp.async bytes by it.
__device__ __forceinline__ bool by_tma(int tb, int t_end) { return WG_TMA && tb + BN <= t_end; }

// The warpgroup index, through a shuffle so the compiler knows it is
// warp-uniform: wgmma behind a branch it thinks divergent gets serialised.
__device__ __forceinline__ int warpgroup() { return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 7), 0); }

// Stops a launch whose dynamic shared memory or block disagrees with the layout.
__device__ __forceinline__ void check_launch() {
  unsigned dyn;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dyn));
  if (dyn < static_cast<unsigned>(SMEM_BYTES) || blockDim.x != THREADS) __trap();
}

// The 1024-byte aligned base of the layout; thread 0 initialises the barriers.
__device__ __forceinline__ unsigned setup(unsigned char* smem) {
  const unsigned base = (smem_u32(smem) + 1023u) & ~1023u;
  if (threadIdx.x == 0) {
    const unsigned bars = base + OFF_BAR;
    for (int i = 0; i < 2 * NCB; ++i) mbar_init(bars + 8 * (BAR_FULL + i), 128);
    for (int i = 0; i < 4; ++i) mbar_init(bars + 8 * (BAR_EMPTY + i), 4 * CTAS);
    mbar_init(bars + 8 * BAR_QFULL, 128);
    mbar_init(bars + 8 * BAR_QEMPTY, 8);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
#if WG_PAIR
  // The peer's barriers are initialised before anyone arrives on them.
  cluster_arrive();
  cluster_wait();
#else
  __syncthreads();
#endif
  return base;
}

// A consumer warp is done reading a group of blocks. Under WG_PAIR both
// producers write every buffer, so the peer's barrier hears it too (its
// address is derived here, at each arrival: the consumers hold no spare
// register for it).
__device__ __forceinline__ void free_group(unsigned bar) {
  mbar_arrive(bar);
#if WG_PAIR
  mbar_arrive_remote(mapa(bar, cluster_rank() ^ 1u));
#endif
}

// P's 16-bit type: the operand type of the products.
__device__ __forceinline__ unsigned pack_p(float lo, float hi) { return WG16_F16 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi); }

// 32-bit shared-memory accesses: the consumers are at their register limit,
// and generic pointers cost two registers each.
__device__ __forceinline__ float lds_f32(unsigned a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ void sts_f32(unsigned a, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}
__device__ __forceinline__ void sts_u32(unsigned a, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void sts_v2f(unsigned a, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void sts_v4(unsigned a, unsigned x, unsigned y, unsigned z, unsigned w) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}

#if !KV_FP8
// bf16 copies by cp.async from one warpgroup, thread p taking 16-byte chunk
// l8 = p % 8 of each 128-byte line for rows / tokens tg + 16k, tg = p / 8.
// Q (BAR_QFULL counts the 128 arrivals):
__device__ __forceinline__ void cp_q(unsigned base, const Pass& ps, const unsigned char* __restrict__ q, int l8,
                                     int tg) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = tg + 16 * k;
    const bool ok = r < ps.nrows;
    const unsigned char* src = q + (ps.q_row0 + (ok ? r : 0)) * ROW_BYTES + l8 * 16;
    const unsigned dst = base + OFF_Q + r * 128 + ((l8 ^ (r & 7)) << 4);
#pragma unroll
    for (int c = 0; c < NCB; ++c) cp_async16(dst + c * CB, src + c * 128, ok);
  }
  mbar_arrive_cp_async(base + OFF_BAR + 8 * BAR_QFULL);
}
// Group g of buffer b from pool rows e (-1: zeros), each block completing
// on its full barrier.
__device__ __forceinline__ void cp_group(unsigned base, const unsigned char* __restrict__ kv, int b, int g,
                                         const int (&e)[4], int l8, int tg) {
  const unsigned bars = base + OFF_BAR, buf = base + OFF_BUF + b * TILE;
#pragma unroll
  for (int i = g ? GROUP_A : 0; i < (g ? NCB : GROUP_A); ++i) {
    const int c = block_at(b, i);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int t = tg + 16 * k;
      const unsigned char* src = kv + static_cast<long long>(max(e[k], 0)) * ROW_BYTES + c * 128 + l8 * 16;
      cp_async16(buf + c * CB + t * 128 + ((l8 ^ (t & 7)) << 4), src, e[k] >= 0);
    }
    mbar_arrive_cp_async(bars + 8 * (BAR_FULL + b * NCB + c));
  }
}

// Producer (warpgroup 2): Q, then both buffers of every pair, by cp.async
// (WG_TMA's whole pages are copied by the consumers, `refill`).
template <int PAGE>
__device__ void produce(unsigned base, const Pass& ps, Phase& ph, const unsigned char* __restrict__ q,
                        const unsigned char* __restrict__ kv) {
  const int p = threadIdx.x - 2 * 128;
  const int l8 = p & 7, tg = p >> 3;
  const unsigned bars = base + OFF_BAR;
  prefetch_pair<PAGE>(ps, 0, p, kv);
  mbar_wait(bars + 8 * BAR_QEMPTY, (ph.items & 1) ^ 1);
  cp_q(base, ps, q, l8, tg);
  const int np = n_pairs(ps);
  for (int pr = 0; pr < np; ++pr, ++ph.pairs) {
    prefetch_pair<PAGE>(ps, pr + 1, p, kv);
    // In the order the consumers free them: 0A, 1A, 0B, 1B.
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      const int b = step & 1, g = step >> 1;
      const int tb = ps.t0 + (2 * pr + b) * BN;
      // Read before the wait; the second group reads them again from L1.
      int e[4];
      tile_rows<PAGE>(ps, tb, tg, e);
      mbar_wait(empty_bar(bars, b, g), (ph.pairs & 1) ^ 1);
      cp_group(base, kv, b, g, e, l8, tg);
    }
  }
  ++ph.items;
}

#if WG_SELF
// WG_SELF (page64, bf16): no producer warpgroup. The warpgroup that frees a
// group of blocks refills it for the next pair, as FlashMLA's decode does,
// so no hand-off to a producer sits between a free and its refill, and four
// fewer warps share each SM's instruction cache. A whole page comes by TMA
// from thread 0 once all four warps freed the group (its empty barrier); a
// tile past the range by cp.async from all 128 threads after a warpgroup
// barrier. `page`: the tile's pool page (thread 0; a TMA tile only).
constexpr int NB_WG = 6;  // + warpgroup index: a barrier of its 128 threads
__device__ __forceinline__ void refill(unsigned base, const Pass& ps, const unsigned char* __restrict__ kv, int tb,
                                       int b, int g, unsigned parity, int page, int t, int wgi) {
  const unsigned bars = base + OFF_BAR, buf = base + OFF_BUF + b * TILE;
  if (by_tma(tb, ps.t_end)) {
    if (t == 0) {
      mbar_wait(empty_bar(bars, b, g), parity);
#pragma unroll
      for (int i = g ? GROUP_A : 0; i < (g ? NCB : GROUP_A); ++i) {
        const int c = block_at(b, i);
        const unsigned full = bars + 8 * (BAR_FULL + b * NCB + c);
        mbar_arrive_expect_tx(full, CB);
        mbar_arrive_n(full, 127);  // the barrier counts 128 arrivals on either path
        tma_tile(buf + c * CB, ps.pages, c * 64, page * BN, full);
      }
    }
    return;
  }
  const int l8 = t & 7, tg = t >> 3;
  int e[4];
  tile_rows<64>(ps, tb, tg, e);
  nbar_sync(NB_WG + wgi, 128);
  cp_group(base, kv, b, g, e, l8, tg);
}

// The pool page of the tile at tb (0 past the range: never copied by TMA).
__device__ __forceinline__ int page_at(const Pass& ps, int tb) { return tb < ps.t_end ? __ldg(ps.idx + (tb >> 6)) : 0; }
#endif

#else
// One 16-byte e4m3 chunk (16 dims) as f16 chunks ch and ch + 1 of row r's
// 128-byte line in the column block at `blk`.
__device__ __forceinline__ void st_e4m3_as_f16(unsigned blk, int r, int ch, uint4 v) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
  unsigned h[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) e4m3x4_to_f16x2x2(w[i], h[2 * i], h[2 * i + 1]);
  const unsigned row = blk + r * 128;
  sts_v4(row + ((ch ^ (r & 7)) << 4), h[0], h[1], h[2], h[3]);
  sts_v4(row + (((ch + 1) ^ (r & 7)) << 4), h[4], h[5], h[6], h[7]);
}

// e4m3 rows: the L2::256B hint fetches each request's 256-byte span from
// DRAM at once (the row's other lines are this thread's next loads or a
// neighbour's); measured 1.5-10% faster than a plain __ldg (docs/kernels.md).
__device__ __forceinline__ uint4 ld_chunk(const unsigned char* p, bool ok) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (ok)
    asm volatile("ld.global.nc.L1::evict_last.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}

// A group of e4m3 rows held in registers: 128-byte lines L0 and L0 + 1
// (column blocks 2 L0 .. 2 L0 + 3) of rows tg + 16k, chunk l8, and with ROPE
// the 64-byte rope (block 8), whose 16 chunks per 4 rows are spread two per
// thread: chunk l8 % 4 of rows k = l8 / 4 and l8 / 4 + 2. Row k's source is
// row e[k] of `src` (e[k] < 0: zeros).
struct Lines {
  uint4 d[10];

  template <bool ROPE>
  __device__ __forceinline__ void load(const unsigned char* __restrict__ src, const int (&e)[4], int L0, int l8) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        d[4 * j + k] = ld_chunk(src + static_cast<long long>(max(e[k], 0)) * D_QK + (L0 + j) * 128 + l8 * 16, e[k] >= 0);
    if (ROPE) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int ek = (l8 >> 2) ? e[1 + 2 * h] : e[2 * h];
        d[8 + h] = ld_chunk(src + static_cast<long long>(max(ek, 0)) * D_QK + 512 + (l8 & 3) * 16, ek >= 0);
      }
    }
  }

  template <bool ROPE>
  __device__ __forceinline__ void store(unsigned buf, int L0, int tg, int l8) const {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) st_e4m3_as_f16(buf + (2 * (L0 + j) + (l8 >> 2)) * CB, tg + 16 * k, 2 * (l8 & 3), d[4 * j + k]);
    if (ROPE) {
#pragma unroll
      for (int h = 0; h < 2; ++h) st_e4m3_as_f16(buf + 8 * CB, tg + 16 * ((l8 >> 2) + 2 * h), 2 * (l8 & 3), d[8 + h]);
    }
    fence_proxy_async();  // generic stores, read by wgmma through the async proxy
  }
};

// Producer (warpgroup 2), fp8: Q, then both buffers of every pair, each
// group of column blocks loaded into registers before its buffer is free.
// Lanes 4-7 of each 8 take the neighbouring row (tg ^ 1): a store phase's
// 8 lanes then write two rows of opposite swizzle parity, so their 16-byte
// chunks fall in 8 different bank groups (with one row, lanes 0-3 and 4-7
// write the same chunks of two blocks: a 2-way conflict).
template <int PAGE>
__device__ void produce(unsigned base, const Pass& ps, Phase& ph, const unsigned char* __restrict__ q,
                        const unsigned char* __restrict__ kv) {
  const int p = threadIdx.x - 2 * 128;
  const int l8 = p & 7, tg = (p >> 3) ^ (l8 >> 2);
  const unsigned bars = base + OFF_BAR;
  prefetch_pair<PAGE>(ps, 0, p, kv);
  {
    const unsigned char* qb = q + ps.q_row0 * D_QK;
    int e[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) e[k] = tg + 16 * k < ps.nrows ? tg + 16 * k : -1;
    Lines ln;
    ln.load<false>(qb, e, 0, l8);
    mbar_wait(bars + 8 * BAR_QEMPTY, (ph.items & 1) ^ 1);
    ln.store<false>(base + OFF_Q, 0, tg, l8);
    ln.load<true>(qb, e, 2, l8);
    ln.store<true>(base + OFF_Q, 2, tg, l8);
    mbar_arrive(bars + 8 * BAR_QFULL);
  }
  const int np = n_pairs(ps);
  for (int pr = 0; pr < np; ++pr, ++ph.pairs) {
    prefetch_pair<PAGE>(ps, pr + 1, p, kv);
    // In the order the consumers free them (V0R_FIRST): 0A, 0B, 1A, 1B. A
    // loop, not unrolled: fewer instructions for the instruction cache to
    // hold beside the consumers' loop (docs/kernels.md).
#pragma unroll 1
    for (int step = 0; step < 4; ++step) {
      const int b = step >> 1, g = step & 1;
      int e[4];
      tile_rows<PAGE>(ps, ps.t0 + (2 * pr + b) * BN, tg, e);
      // Group A of buffer 0 and group B of buffer 1 are blocks 0-3 (lines
      // 0, 1); the others blocks 4-7 (lines 2, 3); group B adds the rope.
      const int L0 = b == g ? 0 : 2;
      Lines ln;
      const unsigned buf = base + OFF_BUF + b * TILE;
      const unsigned full = bars + 8 * (BAR_FULL + b * NCB);
      if (g == 0) {
        ln.load<false>(kv, e, L0, l8);
        mbar_wait(empty_bar(bars, b, g), (ph.pairs & 1) ^ 1);
        ln.store<false>(buf, L0, tg, l8);
      } else {
        ln.load<true>(kv, e, L0, l8);
        mbar_wait(empty_bar(bars, b, g), (ph.pairs & 1) ^ 1);
        ln.store<true>(buf, L0, tg, l8);
        mbar_arrive(full + 8 * 8);
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) mbar_arrive(full + 8 * (2 * L0 + c));
    }
  }
  ++ph.items;
}
#endif

// Hides two addresses from the optimiser, so the descriptors derived from
// them are computed at each use (one add) instead of hoisted out of the
// loop, where 36 k-steps' worth took 144 registers and spilled.
__device__ __forceinline__ void opaque(unsigned& a, unsigned& b) { asm volatile("" : "+r"(a), "+r"(b)); }

// Which tiles the consumers must proxy-fence before wgmma reads them: bytes
// cp.async wrote are in the generic proxy, wgmma reads through the async
// one. TMA writes are async already and the e4m3 producers fence their own
// stores, so only bf16 tiles that came by cp.async (and V4's rope block)
// need it. The fence (MEMBAR.ALL.CTA in SASS) sits between the Q K^T
// wgmmas, so a cp.async tile gets one per group of blocks, not one per block.
constexpr bool CP_TILES = !KV_FP8;   // bf16: cp.async unless the tile came by TMA
constexpr int CP_BLOCK_V4 = 7;       // V4: the rope block, copied by cp.async

// S = Q K^T of the tile in `buf`, column block by column block as each lands:
// the blocks at positions [I0, I1) of buffer B's order (block_at), the first
// of them zeroing S when I0 is 0. Committed as one group. `cp_tile`: the
// tile came by cp.async (bf16), so each group's blocks are awaited together
// and fenced once.
template <int B, int I0 = 0, int I1 = NCB>
__device__ __forceinline__ void qk(float (&s)[32], unsigned base, unsigned parity, bool cp_tile) {
  unsigned qa = base + OFF_Q, buf = base + OFF_BUF + B * TILE;
  opaque(qa, buf);
  const unsigned full = base + OFF_BAR + 8 * (BAR_FULL + B * NCB);
  wgmma_fence();
#pragma unroll
  for (int i = I0; i < I1; ++i) {
    const int c = block_at(B, i);
    if (CP_TILES && cp_tile) {
      if (i == I0 || i == GROUP_A) {
#pragma unroll
        for (int j = i; j < (i < GROUP_A ? min(GROUP_A, I1) : I1); ++j) mbar_wait(full + 8 * block_at(B, j), parity);
        fence_proxy_async();
      }
    } else {
      mbar_wait(full + 8 * c, parity);
      if (WG_V4 && c == CP_BLOCK_V4) fence_proxy_async();
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma16_n64(s, gmma_desc_sw128(qa + c * CB + kk * 32), gmma_desc_sw128(buf + c * CB + kk * 32), i | kk);
    }
  }
  wgmma_commit();
}

// O += P V over one tile's 256 output dims at `v` (P from registers).
__device__ __forceinline__ void pv_rs(float (&o)[128], const unsigned (&pa)[4][4], unsigned v) {
  unsigned dummy = 0;
  opaque(v, dummy);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma16_n256_rs(o, pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], desc_v(v + kk * 2048));
}
// O += P V with P from shared memory at `sp` (64 rows x 64 tokens, K-major).
__device__ __forceinline__ void pv_ss(float (&o)[128], unsigned sp, unsigned v) {
  opaque(sp, v);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma16_n256_ss(o, gmma_desc_sw128(sp + kk * 32), desc_v(v + kk * 2048));
}

// Masks columns at or past each row's limit (only when the tile reaches one).
__device__ __forceinline__ void mask(float (&s)[32], int tb, int c, int lim0, int lim1) {
  if (tb + BN <= min(lim0, lim1)) return;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = tb + 8 * i + 2 * c + e;
      if (t >= lim0) s[4 * i + e] = ninf();
      if (t >= lim1) s[4 * i + 2 + e] = ninf();
    }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Row maxima of this thread's two rows, in the exp2 domain.
__device__ __forceinline__ void row_max(const float (&s)[32], float scale_log2, float& mx0, float& mx1) {
  mx0 = ninf();
  mx1 = ninf();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
  mx0 = quad_max(mx0) * scale_log2;
  mx1 = quad_max(mx1) * scale_log2;
}

// s <- exp2(s * scale_log2 - m) per row (m = -inf counts as 0: a row with
// nothing visible yet stays 0, never NaN); returns the rows' partial sums and
// packs P as the A fragments of the 4 k-steps of P V.
__device__ __forceinline__ void exp_rows(float (&s)[32], float scale_log2, float m0, float m1, float& sum0, float& sum1,
                                         unsigned (&pa)[4][4]) {
  const float u0 = m0 == ninf() ? 0.f : m0, u1 = m1 == ninf() ? 0.f : m1;
  sum0 = 0.f;
  sum1 = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    s[4 * i] = exp2f(fmaf(s[4 * i], scale_log2, -u0));
    s[4 * i + 1] = exp2f(fmaf(s[4 * i + 1], scale_log2, -u0));
    s[4 * i + 2] = exp2f(fmaf(s[4 * i + 2], scale_log2, -u1));
    s[4 * i + 3] = exp2f(fmaf(s[4 * i + 3], scale_log2, -u1));
    sum0 += s[4 * i] + s[4 * i + 1];
    sum1 += s[4 * i + 2] + s[4 * i + 3];
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = pack_p(s[8 * kk], s[8 * kk + 1]);
    pa[kk][1] = pack_p(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack_p(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack_p(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

__device__ __forceinline__ float exp2_diff(float m_old, float m_new) {
  return exp2f(m_old - (m_new == ninf() ? 0.f : m_new));
}

__device__ __forceinline__ void scale_rows(float (&o)[128], float f0, float f1) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[4 * i] *= f0;
    o[4 * i + 1] *= f0;
    o[4 * i + 2] *= f1;
    o[4 * i + 3] *= f1;
  }
}

// P (A-fragment order) to shared memory as the K-major 64 x 64 operand:
// row r's 16-byte chunk i at chunk i ^ (r % 8).
// (r0 % 8 == r1 % 8, so both rows share the swizzle.)
__device__ __forceinline__ unsigned p_addr(unsigned sp, int r0, int c, int i) {
  return sp + r0 * 128 + ((i ^ (r0 & 7)) << 4) + 4 * c;
}
__device__ __forceinline__ void store_p(unsigned sp, int r0, int c, const unsigned (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const unsigned a = p_addr(sp, r0, c, 2 * kk + h);
      sts_u32(a, pa[kk][2 * h]);
      sts_u32(a + 8 * 128, pa[kk][2 * h + 1]);
    }
}

// The new running max and this warpgroup's rescale of rows r0 and r0 + 8,
// written once per quad after all four lanes read the old max.
__device__ __forceinline__ void publish(unsigned sm, unsigned sc, int c, float m0, float m1, float f0, float f1) {
  __syncwarp();
  if (c == 0) {
    sts_f32(sm, m0);
    sts_f32(sm + 32, m1);
    sts_f32(sc, f0);
    sts_f32(sc + 32, f1);
  }
}

// A row's output scale and LSE with a sink logit sk (log2 domain) beside
// its running max m and sum L: the max taken over both first, so neither
// exponential overflows.
__device__ __forceinline__ void with_sink(float sk, float m, float L, float out_scale, float& inv, float& lse_out) {
  if (L > 0.f) {
    const float mf = fmaxf(m, sk), a = exp2f(m - mf);
    const float lf = L * a + exp2f(sk - mf);
    inv = out_scale * a / lf;
    lse_out = (mf + log2f(lf)) * LN2;
  } else {
    inv = 0.f;
    lse_out = sk == ninf() ? ninf() : sk * LN2;
  }
}

// One consumer thread's state over a pass: its rows, O slice, S / P tile and
// row sums, and the shared-memory addresses of the seesaw.
struct Consumer {
  int c, lane, r0, r1, lim0, lim1, t_end;
  unsigned base, bars, buf0, buf1;
  unsigned sm, sc0, sc1, sp0, sp1;  // shared addresses; sm/sc0/sc1 point at row r0
  float scale_log2;
  float acc[128];
  float s[32];
  unsigned pa[4][4];
  float l0, l1;
#if WG_SELF
  const Pass* ps;
  const unsigned char* kv;
  int t;
  int pg0, pg1, nx0, nx1;  // thread 0: the pool pages of the next pair's tiles and of the pair after

  // Thread 0: the pages of pair pr + 2, whose tiles start at tb2 and tb2 + BN.
  __device__ __forceinline__ void load_pages(int tb2) {
    if (t == 0) {
      nx0 = page_at(*ps, tb2);
      nx1 = page_at(*ps, tb2 + BN);
    }
  }
  // Thread 0: pulls page `page` (tile tb of pair pr) into L2 at the start of
  // pair pr - 1, whose refills copy it, where this row block prefetches pair
  // pr (prefetch_pair's rule). Moved here from pair pr - 2's refill, H128
  // took 0.6-4.2% less time; at pr - 3's refill it took 10-14% more than
  // at pr - 2's (docs/kernels.md).
  __device__ __forceinline__ void prefetch_page(int pr, int tb, int page) const {
    if (t != 0 || !ps->prefetch || (ps->pf_n > 1 && pr % ps->pf_n != ps->pf_k) || tb >= ps->t_end) return;
    const unsigned char* row = kv + static_cast<long long>(page) * BN * ROW_BYTES;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(row + k * 16 * ROW_BYTES), "n"(16 * ROW_BYTES)
                   : "memory");
  }
#endif

  // Whether the tile at tb came by cp.async (the producer's rule, by_tma).
  __device__ __forceinline__ bool cp_tile(int tb) const { return !by_tma(tb, t_end); }

  // This warpgroup's softmax inputs: S masked, row maxima in the exp2 domain.
  __device__ __forceinline__ void maxima(int tb, float& mx0, float& mx1) {
    mask(s, tb, c, lim0, lim1);
    row_max(s, scale_log2, mx0, mx1);
  }

  // WG0, pair pr (tile tb in buffer 0): softmax against the running max,
  // O_L += P0 V0L, P0 * scale1 to WG1, O_L = O_L * scale1 + P1 V1L, and with
  // MORE the next pair's S0 behind it.
  template <bool MORE>
  __device__ __forceinline__ void pair0(int pr, int tb, unsigned next_parity) {
    float mx0, mx1, sum0, sum1;
#if WG_SELF
    if constexpr (MORE) {
      load_pages(tb + 4 * BN);
      prefetch_page(pr + 1, tb + 2 * BN, pg0);
    }
#endif
    maxima(tb, mx0, mx1);
    // The running max: none before the first pair, else WG1's of the last.
    const float mo0 = pr ? lds_f32(sm) : ninf(), mo1 = pr ? lds_f32(sm + 32) : ninf();
    const float mn0 = fmaxf(mo0, mx0), mn1 = fmaxf(mo1, mx1);
    const float f0 = exp2_diff(mo0, mn0), f1 = exp2_diff(mo1, mn1);
    publish(sm, sc0, c, mn0, mn1, f0, f1);
    nbar_arrive(NB_SCALE0, CONSUMERS);  // WG1's softmax needs only m0 and scale0
    exp_rows(s, scale_log2, mn0, mn1, sum0, sum1, pa);
    scale_rows(acc, f0, f1);
    l0 = l0 * f0 + sum0;
    l1 = l1 * f1 + sum1;
    wgmma_fence();
    pv_rs(acc, pa, buf0);  // O_L += P0 V0L
    wgmma_commit();
    nbar_sync(NB_SCALE1, CONSUMERS);
    const float g0 = lds_f32(sc1), g1 = lds_f32(sc1 + 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // P0 * scale1, row r0 and r1 of n8 tile i
      const unsigned a = p_addr(sp0, r0, c, i);
      sts_u32(a, pack_p(s[4 * i] * g0, s[4 * i + 1] * g0));
      sts_u32(a + 8 * 128, pack_p(s[4 * i + 2] * g1, s[4 * i + 3] * g1));
    }
    fence_proxy_async();
    nbar_arrive(NB_P0, CONSUMERS);
    wgmma_wait<0>();
    if (lane == 0) free_group(empty_bar(bars, 0, 0));  // V0L
#if WG_SELF
    if constexpr (MORE) {
      refill(base, *ps, kv, tb + 2 * BN, 0, 0, next_parity ^ 1, pg0, t, 0);
    }
#endif
    nbar_sync(NB_P1, CONSUMERS);
    scale_rows(acc, g0, g1);
    l0 *= g0;
    l1 *= g1;
    wgmma_fence();
    pv_ss(acc, sp1, buf1);  // O_L += P1 V1L
    wgmma_commit();
    if constexpr (MORE) {
      // The next S0 over V0L's blocks first: refilled since P0 V0L, they
      // have landed. Once P1 V1L is done its group is freed, before the
      // wait for the blocks WG1 frees last, so buffer 1's refill (WG1's
      // next S1) does not queue behind buffer 0's (as FlashMLA's WG0 does).
      const bool cp = cp_tile(tb + 2 * BN);
      qk<0, 0, GROUP_A>(s, base, next_parity, cp);
      wgmma_wait<1>();
      if (lane == 0) free_group(empty_bar(bars, 1, 1));  // V1L and P1
#if WG_SELF
      refill(base, *ps, kv, tb + 3 * BN, 1, 1, next_parity ^ 1, pg1, t, 0);
      pg0 = nx0;
      pg1 = nx1;
#endif
      qk<0, GROUP_A, NCB>(s, base, next_parity, cp);
      wgmma_wait<0>();
    } else {
      wgmma_wait<0>();
      if (lane == 0) free_group(empty_bar(bars, 1, 1));
    }
  }

  // WG1, pair pr (tile tb in buffer 1): softmax against WG0's max m0,
  // O_R = O_R * scale0 * scale1 + P1 V1R, P1 to WG0, O_R += (P0 scale1) V0R,
  // and with MORE the next pair's S1.
  template <bool MORE>
  __device__ __forceinline__ void pair1(int pr, int tb, unsigned next_parity) {
    float mx0, mx1, sum0, sum1;
#if WG_SELF
    if constexpr (MORE) {
      load_pages(tb + 3 * BN);
      prefetch_page(pr + 1, tb + 2 * BN, pg1);
    }
#endif
    maxima(tb, mx0, mx1);
    nbar_sync(NB_SCALE0, CONSUMERS);
    const float m00 = lds_f32(sm), m01 = lds_f32(sm + 32);
    const float f0 = lds_f32(sc0), f1 = lds_f32(sc0 + 32);
    const float mn0 = fmaxf(m00, mx0), mn1 = fmaxf(m01, mx1);
    const float g0 = exp2_diff(m00, mn0), g1 = exp2_diff(m01, mn1);
    publish(sm, sc1, c, mn0, mn1, g0, g1);
    nbar_arrive(NB_SCALE1, CONSUMERS);
    exp_rows(s, scale_log2, mn0, mn1, sum0, sum1, pa);
    store_p(sp1, r0, c, pa);
    fence_proxy_async();
    nbar_arrive(NB_P1, CONSUMERS);
    scale_rows(acc, f0 * g0, f1 * g1);
    l0 = l0 * (f0 * g0) + sum0;
    l1 = l1 * (f1 * g1) + sum1;
    if constexpr (V0R_FIRST) {
      nbar_sync(NB_P0, CONSUMERS);
      wgmma_fence();
      pv_ss(acc, sp0, buf0 + 4 * CB);  // O_R += (P0 scale1) V0R
      wgmma_commit();
      pv_rs(acc, pa, buf1 + 4 * CB);  // O_R += P1 V1R
      wgmma_commit();
      wgmma_wait<1>();
      if (lane == 0) free_group(empty_bar(bars, 0, 1));  // V0R
      wgmma_wait<0>();
      if (lane == 0) free_group(empty_bar(bars, 1, 0));  // V1R
    } else {
      wgmma_fence();
      pv_rs(acc, pa, buf1 + 4 * CB);  // O_R += P1 V1R
      wgmma_commit();
      nbar_sync(NB_P0, CONSUMERS);
      pv_ss(acc, sp0, buf0 + 4 * CB);  // O_R += (P0 scale1) V0R
      wgmma_commit();
      wgmma_wait<1>();
      if (lane == 0) free_group(empty_bar(bars, 1, 0));  // V1R
#if WG_SELF
      if constexpr (MORE) {
        refill(base, *ps, kv, tb + 2 * BN, 1, 0, next_parity ^ 1, pg1, t, 1);
      }
#endif
      wgmma_wait<0>();
      if (lane == 0) free_group(empty_bar(bars, 0, 1));  // V0R and P0
#if WG_SELF
      if constexpr (MORE) {
        refill(base, *ps, kv, tb + BN, 0, 1, next_parity ^ 1, pg0, t, 1);
        pg0 = nx0;
        pg1 = nx1;
      }
#endif
    }
    if constexpr (MORE) {
      qk<1>(s, base, next_parity, cp_tile(tb + 2 * BN));
      wgmma_wait<0>();
    }
  }
};

// Consumers (warpgroups 0 and 1): the seesaw over the pass's pairs, then
// this warpgroup's 256 output dims (WG_SELF: loading Q and KV from `q` and
// `kv` themselves). `rows.lim(r)` is row r's token limit
// (<= t0 for rows past nrows), `rows.o_row(r)` its output / LSE row; with
// SINK, `rows.sink_log2(r)` (log2 domain, -inf: none) joins row r's
// denominator and LSE as one more logit with a zero value (V4's sink).
// STAGE (a non-persistent kernel): the rows leave through shared memory,
// by bulk copy per row and warpgroup (1 KB of f32 partial, or 512 bytes of
// bf16 o), instead of 4-byte stores (ptxas splits the float2 stores: the
// accumulators are not register pairs), which throttled the LSU in the
// epilogue. f32 rows are STAGE_ROW bytes apart (8 words of bank offset a
// row: a warp's 8 rows cover the banks twice, the least for 256 bytes),
// bf16 rows STAGE_ROW_BF16 (4 words: its 4-byte stores cover them once).
// Q and both buffers are free by then.
constexpr int STAGE_ROW = 1056;
constexpr int STAGE_ROW_BF16 = 528;
static_assert(2 * BM * STAGE_ROW <= 3 * TILE, "the staged rows fit in Q and the two buffers");

template <class Rows, bool SINK = false, bool STAGE = false>
__device__ void consume(unsigned base, const Pass& ps, const Rows& rows, Phase& ph,
                        float scale_log2, float out_scale, bool to_part, __nv_bfloat16* __restrict__ o,
                        float* __restrict__ part_o, float* __restrict__ lse,
                        const unsigned char* __restrict__ q = nullptr, const unsigned char* __restrict__ kv = nullptr) {
  const int wgi = warpgroup();
  const int t = threadIdx.x & 127, warp = t >> 5;
  Consumer cs;
  cs.lane = t & 31;
  cs.c = cs.lane & 3;
  cs.r0 = 16 * warp + (cs.lane >> 2);
  cs.r1 = cs.r0 + 8;
  cs.lim0 = rows.lim(cs.r0);
  cs.lim1 = rows.lim(cs.r1);
  cs.t_end = ps.t_end;
  cs.base = base;
  cs.bars = base + OFF_BAR;
  cs.buf0 = base + OFF_BUF;
  cs.buf1 = cs.buf0 + TILE;
  cs.sm = base + OFF_M + 4 * cs.r0;
  cs.sc0 = base + OFF_SC0 + 4 * cs.r0;
  cs.sc1 = base + OFF_SC1 + 4 * cs.r0;
  cs.sp0 = WG_V4 ? base + OFF_P : base + OFF_BUF + (NCB - 1) * CB;
  cs.sp1 = cs.sp0 + (WG_V4 ? CB : TILE);
  cs.scale_log2 = scale_log2;
  cs.l0 = 0.f;
  cs.l1 = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) cs.acc[i] = 0.f;
  const int c = cs.c, r0 = cs.r0, r1 = cs.r1;
  const unsigned bars = cs.bars;
  const unsigned sl = base + OFF_L;
  const int np = n_pairs(ps), nrows = ps.nrows, t0 = ps.t0;
  const long long o0 = rows.o_row(r0), o1 = rows.o_row(r1);  // now, so Rows need not stay live
  float sk0 = 0.f, sk1 = 0.f;
  if constexpr (SINK) {
    sk0 = rows.sink_log2(r0);
    sk1 = rows.sink_log2(r1);
  }

#if WG_SELF
  // One pass a CTA (page64): Q and the first pair by the consumers, each
  // warpgroup its own tile; the fresh empty barriers pass parity 1.
  cs.ps = &ps;
  cs.kv = kv;
  cs.t = t;
  cs.pg0 = cs.pg1 = cs.nx0 = cs.nx1 = 0;
  if (wgi == 0) cp_q(base, ps, q, t & 7, t >> 3);
  if (np > 0) {
    const int tb = t0 + wgi * BN, pg = t == 0 ? page_at(ps, tb) : 0;
    refill(base, ps, kv, tb, wgi, 0, 1, pg, t, wgi);
    refill(base, ps, kv, tb, wgi, 1, 1, pg, t, wgi);
    if (t == 0) {
      cs.pg0 = page_at(ps, t0 + 2 * BN);
      cs.pg1 = page_at(ps, t0 + 3 * BN);
    }
  }
#endif
  mbar_wait(bars + 8 * BAR_QFULL, ph.items & 1);
  fence_proxy_async();  // Q came (in part) by cp.async
  if (np > 0) {
    if (wgi == 0) {
      qk<0>(cs.s, base, ph.pairs & 1, cs.cp_tile(t0));
    } else {
      qk<1>(cs.s, base, ph.pairs & 1, cs.cp_tile(t0 + BN));
    }
    wgmma_wait<0>();
    if (wgi == 0) {
      for (int pr = 0; pr + 1 < np; ++pr) cs.pair0<true>(pr, t0 + 2 * pr * BN, (ph.pairs + pr + 1) & 1);
      cs.pair0<false>(np - 1, t0 + 2 * (np - 1) * BN, 0);
    } else {
      for (int pr = 0; pr + 1 < np; ++pr) cs.pair1<true>(pr, t0 + (2 * pr + 1) * BN, (ph.pairs + pr + 1) & 1);
      cs.pair1<false>(np - 1, t0 + (2 * np - 1) * BN, 0);
    }
  }
  ph.pairs += np;
  if (cs.lane == 0) mbar_arrive(bars + 8 * BAR_QEMPTY);
  ++ph.items;

  // l over the quad, then over both warpgroups (each summed its own tiles).
  float l0 = cs.l0, l1 = cs.l1;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (c == 0) {
    sts_f32(sl + 4 * (wgi * BM + r0), l0);
    sts_f32(sl + 4 * (wgi * BM + r1), l1);
  }
  const float m0 = lds_f32(cs.sm), m1 = lds_f32(cs.sm + 32);  // stale when np == 0, but then L == 0
  nbar_sync(NB_L, CONSUMERS);
  const float L0 = lds_f32(sl + 4 * r0) + lds_f32(sl + 4 * (BM + r0));
  const float L1 = lds_f32(sl + 4 * r1) + lds_f32(sl + 4 * (BM + r1));
  const bool v0 = r0 < nrows, v1 = r1 < nrows;
  float i0, i1;
  if constexpr (SINK) {
    float e0, e1;
    with_sink(sk0, m0, L0, out_scale, i0, e0);
    with_sink(sk1, m1, L1, out_scale, i1, e1);
    if (wgi == 0 && c == 0) {
      if (v0) lse[o0] = e0;
      if (v1) lse[o1] = e1;
    }
  } else {
    if (wgi == 0 && c == 0) {
      if (v0) lse[o0] = L0 > 0.f ? (m0 + log2f(L0)) * LN2 : ninf();
      if (v1) lse[o1] = L1 > 0.f ? (m1 + log2f(L1)) * LN2 : ninf();
    }
    i0 = L0 > 0.f ? out_scale / L0 : 0.f;
    i1 = L1 > 0.f ? out_scale / L1 : 0.f;
  }
  if constexpr (STAGE) {
    // After NB_L neither warpgroup has a wgmma in flight, and every tile
    // has landed: Q and the buffers are free.
    const int pitch = to_part ? STAGE_ROW : STAGE_ROW_BF16;
    const unsigned st0 = base + (wgi * BM + r0) * pitch + (to_part ? 8 : 4) * c, st1 = st0 + 8 * pitch;
    if (to_part) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const float* a = cs.acc + 4 * i;
        sts_v2f(st0 + 32 * i, a[0] * i0, a[1] * i0);
        sts_v2f(st1 + 32 * i, a[2] * i1, a[3] * i1);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const float* a = cs.acc + 4 * i;
        sts_u32(st0 + 16 * i, pack_bf16x2(a[0] * i0, a[1] * i0));
        sts_u32(st1 + 16 * i, pack_bf16x2(a[2] * i1, a[3] * i1));
      }
    }
    fence_proxy_async();  // generic stores, read by the bulk copy through the async proxy
    __syncwarp();
    // Lane l < 16 copies the warp's row 16 warp + l: r0 of lane 4l, or r1 of lane 4(l - 8).
    const int l = cs.lane & 15, src = 4 * (l & 7);
    const long long oa = __shfl_sync(0xffffffffu, o0, src), ob = __shfl_sync(0xffffffffu, o1, src);
    const int r = 16 * warp + l;
    if (cs.lane < 16 && r < nrows) {
      const long long orow = l < 8 ? oa : ob;
      const unsigned from = base + (wgi * BM + r) * pitch;
      if (to_part) {
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 1024;\n" ::"l"(
                         part_o + orow * D_V + 256 * wgi),
                     "r"(from)
                     : "memory");
      } else {
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 512;\n" ::"l"(
                         o + orow * D_V + 256 * wgi),
                     "r"(from)
                     : "memory");
      }
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the rows stay until read
    }
    return;
  }
  const int d0 = 256 * wgi + 2 * c;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int d = d0 + 8 * i;
    const float* a = cs.acc + 4 * i;
    if (to_part) {
      if (v0) *reinterpret_cast<float2*>(part_o + o0 * D_V + d) = make_float2(a[0] * i0, a[1] * i0);
      if (v1) *reinterpret_cast<float2*>(part_o + o1 * D_V + d) = make_float2(a[2] * i1, a[3] * i1);
    } else {
      if (v0) *reinterpret_cast<unsigned*>(o + o0 * D_V + d) = pack_bf16x2(a[0] * i0, a[1] * i0);
      if (v1) *reinterpret_cast<unsigned*>(o + o1 * D_V + d) = pack_bf16x2(a[2] * i1, a[3] * i1);
    }
  }
}

// Role split: the producer gives registers to the consumers (setmaxnreg
// needs the register cap of __launch_bounds__(THREADS, 1) at entry and one
// branch per role).
template <int N>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
// fp8's producer holds a group of e4m3 lines (40 registers) while it waits.
// WG_SELF keeps the split, although its producer warpgroup leaves at once:
// 240 registers for the consumers measured the same as 216 (docs/kernels.md).
constexpr int CONSUMER_REGS = KV_FP8 ? 208 : 216;
constexpr int PRODUCER_REGS = KV_FP8 ? 88 : 72;
// The CTA keeps the registers it was launched with (ptxas's 168 per thread
// at 384 threads): an increase beyond what the producer gave back never
// returns, and the kernel hangs.
static_assert(2 * 128 * CONSUMER_REGS + 128 * PRODUCER_REGS <= 168 * THREADS, "the launch's registers");

}  // namespace wg
}  // namespace mla
