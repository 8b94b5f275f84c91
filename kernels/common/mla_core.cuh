// The MLA decode core shared by ps1.cu and page64.cu: one CTA of THREADS
// threads streams a token range of one sequence's paged KV through a cp.async ring
// and computes softmax(Q K^T) V for up to 16*MT query-head rows. bf16: mma.sync
// for both products. fp8 (a8w8): S^T = K Q^T by wgmma on e4m3 (K tile as the
// 64-row A operand, Q as B, both from shared memory in the 128-byte swizzle
// layout), because Hopper emulates e4m3 mma.sync through f16; P V stays f16
// mma.sync (P in e4m3 would miss the fp8 tolerance) with V converted exactly.
//
// Defines (all compile-time):
//   HK      kernel heads, multiple of 16, 16..128
//   KV_FP8  0: bf16 Q/KV; 1: e4m3 Q/KV with per-tensor scales
//   MT      16-row m-tiles per pass over the KV (1 or 2; default 1)
//   WARPS   8 or 16 warps per CTA (default 16 for MT=1, else 8)
//   GROUPS  consumer groups per CTA (1 or 2; default 2 for MT=1, else 1).
//           With 2, each group of WARPS/2 warps runs the algorithm below on
//           alternate tiles (tile t -> group t%2) with its own cp.async ring,
//           scratch, named barrier and online-softmax state, so one group's
//           softmax overlaps the other's mma; the two (m, l, O) are merged in
//           shared memory at the end.
//   BN      tokens per tile (default 64 for fp8, 32 for bf16)
//   STAGES  cp.async ring depth per group (default 2 with GROUPS=2, else 4)
//   QSMEM   bf16 only: 1: Q sits in shared memory, shared by the groups,
//           and each warp loads its A fragments with ldmatrix per k-step;
//           0: each warp keeps its Q slice in registers (36 per m-tile).
//           Default: 1 with GROUPS=2 (512 threads leave 128 registers each).
//           fp8 always keeps Q in shared memory (the wgmma B operand).
//   LD_LINES fp8: 1 = each loader thread takes two tokens (t, t+32)
//           and 8 lanes cover a token's 128-byte line, so one cp.async
//           instruction asks for whole lines (320 line requests per tile
//           instead of 576 half lines); 0 = one token per 4 threads (default)
//   EARLY_Q fp8, or bf16 with QSMEM: 1 = Q's loads go out before the first
//           KV tiles are requested and are stored after (ps1: -1% at b64
//           c4096 fp8; page64 lost 2-5% in its loop's codegen, so it keeps 0)
//
// fp8 computes its addresses once where it can: the loader's and the V
// ldmatrix's swizzled offsets once per pass, the wgmma descriptors once per
// tile plus a constant per k-step. That cuts the tile loop's integer work:
// page64 +2.2..+7.6 points of copy bandwidth; ps1, with LD_LINES, 1.8-4.6%
// less time and no per-pass spill (8 B without it).
//
// Warp roles, within a group (w: warp of the group): for S = Q K^T, bf16: warp w owns dims [144*(w%4), +144) and the
// token group w/4 of the tile (split-K; the 4 partial S tiles are summed
// through shared memory); fp8: warpgroup w/4 owns dims [288*(w/4), +288) of
// all BN = 64 tokens (2 partial S tiles); the softmax runs on
// all threads of the group, GTHREADS/(16*MT) per row; for O += P V warp w
// owns output dims [DW*w, DW*(w+1)). The group's first LD_THREADS threads
// also issue its tile loads.
#pragma once
#include <cuda_bf16.h>

#include "common/fp8.cuh"
#include "common/mla_dims.cuh"
#include "common/ptx.cuh"

#ifndef HK
#error "define HK: kernel heads, a multiple of 16 from 16 to 128"
#endif
#ifndef KV_FP8
#error "define KV_FP8: 0 for bf16 Q and KV, 1 for e4m3 Q and KV"
#endif
#ifndef MT
#define MT 1
#endif
#ifndef WARPS
#define WARPS (MT == 1 ? 16 : 8)
#endif
#ifndef GROUPS
#define GROUPS (MT == 1 && WARPS == 16 ? 2 : 1)
#endif
#ifndef BN
#define BN (KV_FP8 ? 64 : 32)
#endif
#ifndef STAGES
#define STAGES (GROUPS == 2 ? 2 : 4)
#endif
#ifndef LD_LINES
#define LD_LINES 0
#endif
#ifndef QSMEM
#define QSMEM (GROUPS == 2 && !KV_FP8 ? 1 : 0)
#endif
#ifndef EARLY_Q
#define EARLY_Q 0
#endif

static_assert(HK % 16 == 0 && HK >= 16 && HK <= 128, "HK must be a multiple of 16 in 16..128");
static_assert(MT == 1 || MT == 2, "MT must be 1 or 2");
static_assert(STAGES >= 2 && STAGES <= 6, "STAGES must be 2..6");
static_assert(WARPS == 8 || WARPS == 16, "WARPS must be 8 or 16");
static_assert(MT == 1 || WARPS == 8, "MT=2 needs WARPS=8 (16 warps would spill)");
static_assert(GROUPS == 1 || (GROUPS == 2 && WARPS == 16), "GROUPS=2 needs WARPS=16 (two groups of 8)");
static_assert(BN == 16 || BN == 32 || BN == 64, "BN must be 16, 32 or 64");
static_assert(QSMEM == 0 || QSMEM == 1, "QSMEM must be 0 or 1");
static_assert(EARLY_Q == 0 || EARLY_Q == 1, "EARLY_Q must be 0 or 1");
static_assert(LD_LINES == 0 || KV_FP8, "LD_LINES is an fp8 loader");
static_assert(!KV_FP8 || QSMEM == 0, "fp8 keeps Q in shared memory as e4m3: QSMEM is for bf16");
static_assert(!KV_FP8 || (BN == 64 && WARPS / GROUPS == 8), "fp8: BN 64 (the wgmma M) and two warpgroups per group");

namespace mla {

constexpr int THREADS = 32 * WARPS;
constexpr int GW = WARPS / GROUPS;             // warps per consumer group
constexpr int GTHREADS = 32 * GW;              // threads per group
constexpr int EB = KV_FP8 ? 1 : 2;             // bytes per element
constexpr int ROW_BYTES = D_QK * EB;           // one KV / Q row in memory
constexpr int RS = ROW_BYTES + 16;             // bf16 tile row stride: ldmatrix conflict-free
constexpr int SWB = 5;                         // fp8: 128-byte column blocks of a row (the last half used)
constexpr int TILE_BYTES = KV_FP8 ? SWB * BN * 128 : BN * RS;
constexpr int KPARTS = KV_FP8 ? 2 : 4;         // partial S tiles (split-K)
constexpr int NWN = GW / 4;                    // token groups in S = Q K^T
constexpr int TW = BN / NWN;                   // tokens per warp in S
constexpr int NT = TW / 8;                     // n8 tiles of S per warp
constexpr int DW = D_V / GW;                   // output dims per warp in O += P V
constexpr int NJ = DW / 8;                     // n8 tiles of O per warp
constexpr int ROWS = 16 * MT;
constexpr int SP_LD = KV_FP8 ? BN + 4 : BN + 8;  // floats; fp8 scalar / bf16 8-byte stores conflict-free
constexpr int PS_LD = BN + 8;                  // 16-bit; ldmatrix conflict-free
constexpr int TPR = GTHREADS / ROWS;           // softmax threads per row
constexpr int TPT = BN / TPR;                  // tokens per softmax thread
constexpr int ROW_CH = ROW_BYTES / 16;         // 16-byte chunks per row
__host__ __device__ constexpr int pick_ld_tpt(int cap) { return cap <= 1 ? 1 : (ROW_CH % cap == 0 ? cap : pick_ld_tpt(cap - 1)); }
constexpr int LD_TPT = pick_ld_tpt((GTHREADS < 256 ? GTHREADS : 256) / BN);  // loader threads per token
constexpr int LD_THREADS = BN * LD_TPT;        // threads of a group that issue tile loads
constexpr int LD_CH = ROW_CH / LD_TPT;         // 16-byte chunks per loader thread
constexpr int RING_BYTES = STAGES * TILE_BYTES;  // one group's ring
constexpr int SCR_SP = 0;                        // offsets inside a group's scratch
constexpr int SCR_PS = SCR_SP + KPARTS * ROWS * SP_LD * 4;
constexpr int SCR_AL = SCR_PS + ROWS * PS_LD * 2;
constexpr int SCR_L = SCR_AL + ROWS * 4;
constexpr int SCR_BYTES = SCR_L + ROWS * 4;
constexpr int OFF_SCR = GROUPS * RING_BYTES;     // group g's scratch at OFF_SCR + g * SCR_BYTES
constexpr int OFF_Q = KV_FP8 ? (OFF_SCR + GROUPS * SCR_BYTES + 1023) / 1024 * 1024 : OFF_SCR + GROUPS * SCR_BYTES;
constexpr int RSQ = D_QK * 2 + 16;               // bf16 Q row stride in shared memory
constexpr int Q_BYTES = KV_FP8 ? SWB * ROWS * 128 : (QSMEM ? ROWS * RSQ : 0);
constexpr int ALIGN_SLACK = KV_FP8 ? 1024 : 0;   // the swizzle atoms need a 1024-byte aligned base
constexpr int SMEM_BYTES = OFF_Q + Q_BYTES + ALIGN_SLACK;

static_assert(LD_CH * LD_TPT * 16 == ROW_BYTES, "loader covers a row exactly");
static_assert(LD_THREADS <= GTHREADS, "loaders are threads of the group");
static_assert(KV_FP8 || NT == 1 || NT == 2, "bf16 S path handles 1 or 2 n8 tiles per warp");
static_assert(GROUPS == 1 || ROWS * D_V * 4 <= RING_BYTES, "group 1's O fits its ring for the merge");
static_assert(SCR_BYTES % 16 == 0 && RING_BYTES % (KV_FP8 ? 1024 : 16) == 0, "aligned regions");
static_assert(TPT == 1 || TPT == 2 || TPT == 4 || TPT == 8, "softmax vector width");
static_assert(SMEM_BYTES <= 232448, "fits the sm_90 opt-in shared memory");

// Barrier of one consumer group (named barrier 1 + grp over its threads), or
// of the whole CTA with one group.
__device__ __forceinline__ void group_sync(int grp) {
  if constexpr (GROUPS == 1) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + grp), "n"(GTHREADS) : "memory");
  }
}

// Stops a launch whose dynamic shared memory is smaller than the layout or
// whose block is not THREADS wide (host and defines disagree).
__device__ __forceinline__ void check_smem() {
  unsigned dyn;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dyn));
  if (dyn < static_cast<unsigned>(SMEM_BYTES) || blockDim.x != THREADS) __trap();
}

// One pass: up to MT m-tiles of 16 consecutive Q rows, all over the same
// token range of one sequence.
struct Pass {
  long long q_row[MT];  // first row of each m-tile in q ([*, 576])
  long long o_row[MT];  // first row in the output ([*, 512] and lse)
  int lim[MT];          // m-tile sees tokens j < lim (0 for an unused m-tile)
  int valid[MT];        // m-tile holds real rows (else skipped on output)
  int t0, t1;           // tokens streamed: [t0, t1)
};

// The pool entry of token j: its row (page size 1) or its page (64). Kept as
// the loaded int until the cp.async issue one tile later: widening it right
// away made the compiler consume the load at once, so the loader warps would
// wait out a full memory latency every tile.
template <int PAGE>
__device__ __forceinline__ int pool_entry(const int* __restrict__ idx, int j) {
  return __ldg(idx + (PAGE == 1 ? j : j >> 6));
}

#if KV_FP8
// S^T partial of warpgroup WG (dims [288*WG, +288)): 9 wgmma k-steps of 32,
// each into a fresh accumulator (two alternate) and summed in f32, because a
// chained fp8 accumulator truncates to 13 bits at every step (LSE errors of
// 1.2e-3 to 2.1e-3 that way, over the 1e-3 tolerance). WG is a template
// argument so every step's descriptor is the tile's plus a constant.
template <int WG>
__device__ __forceinline__ void qk_wgmma(float (&sacc)[ROWS / 2], unsigned long long k_desc,
                                         unsigned long long q_desc) {
  float part[2][ROWS / 2];
#pragma unroll
  for (int c = 0; c < 10; ++c) {
    if (c < 9) {
      const int d0 = 288 * WG + 32 * c;  // first dim (byte) of the k-step
      const unsigned long long ka = static_cast<unsigned long long>(((d0 >> 7) * (BN * 128) + (d0 & 127)) >> 4);
      const unsigned long long qb = static_cast<unsigned long long>(((d0 >> 7) * (ROWS * 128) + (d0 & 127)) >> 4);
      wgmma_fence();  // part[c % 2] was last read by the f32 sum below
      wgmma_e4m3<ROWS>(part[c % 2], k_desc + ka, q_desc + qb, 0);
      wgmma_commit();
    }
    if (c >= 1) {
      if (c < 9) {
        wgmma_wait<1>();  // step c-1 done, step c in flight
      } else {
        wgmma_wait<0>();
      }
      float(&p)[ROWS / 2] = part[(c - 1) % 2];
      fence_regs(p);
#pragma unroll
      for (int i = 0; i < ROWS / 2; ++i) sacc[i] = c == 1 ? p[i] : sacc[i] + p[i];
    }
  }
}
#endif

// Runs one pass. Outputs go to `o` (bf16) or, with `to_part`, to `part_o`
// (f32); `lse` is the matching LSE array. Must be called by all THREADS threads.
template <int PAGE>
__device__ void attend(unsigned char* smem, const Pass& ps, const unsigned char* __restrict__ q,
                       const unsigned char* __restrict__ kv, const int* __restrict__ idx, float scale_log2,
                       float out_scale, bool to_part, __nv_bfloat16* __restrict__ o,
                       float* __restrict__ part_o, float* __restrict__ lse) {
#if KV_FP8
  smem += (1024u - (smem_u32(smem) & 1023u)) & 1023u;  // ALIGN_SLACK covers this
#endif
  // Everything below is per consumer group: tid and warp count within it.
  const int grp = GROUPS == 1 ? 0 : static_cast<int>(threadIdx.x) / GTHREADS;
  const int tid = static_cast<int>(threadIdx.x) - grp * GTHREADS, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, qd = lane & 3;
#if !KV_FP8
  const int kw = warp & 3, nw = warp >> 2;  // bf16 S: dim quarter, token group
#endif
  const int li = lane >> 3, lr = lane & 7;  // ldmatrix: which 8x8 matrix, which row
  unsigned char* scr = smem + OFF_SCR + grp * SCR_BYTES;
  float* sp = reinterpret_cast<float*>(scr + SCR_SP);
  unsigned short* psm = reinterpret_cast<unsigned short*>(scr + SCR_PS);
  float* alpha_s = reinterpret_cast<float*>(scr + SCR_AL);
  float* l_s = reinterpret_cast<float*>(scr + SCR_L);
  const unsigned smem0 = smem_u32(smem + grp * RING_BYTES);
  const unsigned ps_base = smem_u32(psm);

#if KV_FP8 || QSMEM
#if EARLY_Q
  // Q of the pass goes to shared memory (fp8: e4m3 in the wgmma layout,
  // column block b = dims [128b, +128) at OFF_Q + b*ROWS*128, swizzled
  // 16-byte chunks; bf16: rows of RSQ bytes). Its loads go out here, into
  // registers, and are stored after the first KV tiles are requested below,
  // so Q's round trip overlaps the page table's instead of preceding it.
  constexpr int Q_CH = ROWS * ROW_CH;
  constexpr int Q_PT = (Q_CH + THREADS - 1) / THREADS;
  uint4 qv[Q_PT];
#pragma unroll
  for (int k = 0; k < Q_PT; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * THREADS;
    const int r = i / ROW_CH, ch = i % ROW_CH;
    const bool hi = MT > 1 && r >= 16;
    qv[k] = make_uint4(0u, 0u, 0u, 0u);
    if (i < Q_CH && (hi ? ps.valid[MT - 1] : ps.valid[0])) {
      const long long qr = (hi ? ps.q_row[MT - 1] : ps.q_row[0]) + (r & 15);
      qv[k] = __ldg(reinterpret_cast<const uint4*>(q + qr * ROW_BYTES + ch * 16));
    }
  }
  auto store_q = [&]() {
    unsigned char* qs = smem + OFF_Q;
#pragma unroll
    for (int k = 0; k < Q_PT; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * THREADS;
      if (i >= Q_CH) continue;
      const int r = i / ROW_CH, ch = i % ROW_CH;
#if KV_FP8
      *reinterpret_cast<uint4*>(qs + (ch >> 3) * (ROWS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4)) = qv[k];
#else
      *reinterpret_cast<uint4*>(qs + r * RSQ + ch * 16) = qv[k];
#endif
    }
#if KV_FP8
    fence_proxy_async();
#endif
    __syncthreads();
  };
#elif KV_FP8
  // Q of the pass into shared memory as e4m3 in the wgmma layout: column
  // block b (dims [128b, +128)) at OFF_Q + b*ROWS*128, swizzled 16-byte chunks.
  {
    unsigned char* qs = smem + OFF_Q;
    for (int i = threadIdx.x; i < ROWS * ROW_CH; i += THREADS) {
      const int r = i / ROW_CH, ch = i % ROW_CH;
      const bool hi = MT > 1 && r >= 16;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (hi ? ps.valid[MT - 1] : ps.valid[0]) {
        const long long qr = (hi ? ps.q_row[MT - 1] : ps.q_row[0]) + (r & 15);
        v = __ldg(reinterpret_cast<const uint4*>(q + qr * ROW_BYTES + ch * 16));
      }
      *reinterpret_cast<uint4*>(qs + (ch >> 3) * (ROWS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4)) = v;
    }
    fence_proxy_async();
    __syncthreads();
  }
#else
  // Q of the pass into shared memory (bf16), rows of RSQ bytes.
  {
    unsigned char* qs = smem + OFF_Q;
    for (int i = threadIdx.x; i < ROWS * 72; i += THREADS) {
      const int r = i / 72, ch = i % 72;
      const bool hi = MT > 1 && r >= 16;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (hi ? ps.valid[MT - 1] : ps.valid[0]) {
        const long long qr = (hi ? ps.q_row[MT - 1] : ps.q_row[0]) + (r & 15);
        v = __ldg(reinterpret_cast<const uint4*>(q + qr * ROW_BYTES + ch * 16));
      }
      *reinterpret_cast<uint4*>(qs + r * RSQ + ch * 16) = v;
    }
    __syncthreads();
  }
#endif
#if KV_FP8
  const unsigned q_s = smem_u32(smem + OFF_Q);
#else
  const unsigned q_base = smem_u32(smem + OFF_Q) + (lane & 15) * RSQ + (kw * 144 + (lane >> 4) * 8) * 2;
#endif
#else
  // Q fragments of this warp's 144-dim slice, for every m-tile.
  unsigned qf[MT][9][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const unsigned char* r0 = q + (ps.q_row[mt] + g) * ROW_BYTES;
    const unsigned char* r8 = r0 + 8 * ROW_BYTES;
#pragma unroll
    for (int c = 0; c < 9; ++c) {
      if (ps.valid[mt]) {
        const int off = (kw * 144 + c * 16 + 2 * qd) * 2;
        qf[mt][c][0] = ldg_u32(r0 + off);
        qf[mt][c][1] = ldg_u32(r8 + off);
        qf[mt][c][2] = ldg_u32(r0 + off + 16);
        qf[mt][c][3] = ldg_u32(r8 + off + 16);
      } else {
        qf[mt][c][0] = qf[mt][c][1] = qf[mt][c][2] = qf[mt][c][3] = 0u;
      }
    }
  }

#endif

  // Loader role: one token per thread, LD_CH 16-byte chunks of it. Local
  // tile u of this group is tile grp + GROUPS*u of the pass.
  const int ntiles_all = ps.t1 > ps.t0 ? (ps.t1 - ps.t0 + BN - 1) / BN : 0;
  const int ntiles = GROUPS == 1 ? ntiles_all : (ntiles_all > grp ? (ntiles_all - grp + 1) / 2 : 0);
  // first token of this group's local tile u
  auto tok0 = [&](int u) -> int {
    const int t = GROUPS == 1 ? u : grp + 2 * u;
    return ps.t0 + t * BN;
  };
  const int ld_tok = tid / LD_TPT, ld_c = tid % LD_TPT;
  const bool loader = tid < LD_THREADS;
#if KV_FP8 && !LD_LINES
  // fp8: chunk ld_c + 4k of the token sits in column block k/2 as chunk
  // ld_c + 4(k%2), swizzled by the token's row: two offsets cover all nine
  static_assert(LD_TPT == 4 && LD_CH == 9, "fp8 loader: 4 threads per token, 9 chunks each");
  const unsigned ld_sw0 = ld_tok * 128 + ((ld_c ^ (ld_tok & 7)) << 4);
  const unsigned ld_sw1 = ld_tok * 128 + (((ld_c + 4) ^ (ld_tok & 7)) << 4);
#endif
#if LD_LINES
  // two tokens per thread, 8 lanes per token: lane ld8 takes chunk ld8 of
  // each of the row's 128-byte lines (column blocks 0-3), lanes 0-3 also
  // the last half line (block 4); its swizzled chunk is ld8 ^ (token % 8)
  static_assert(BN == 64 && LD_THREADS == 256, "LD_LINES: 64-token tiles, 256 loaders");
  const int ld8_tok = tid / 8, ld8 = tid % 8;
  struct Ent {
    int a, b;  // pool entries of tokens ld8_tok and ld8_tok + 32; -1: none
  };
  auto row_of = [&](int t) -> Ent {
    const int j = tok0(t) + ld8_tok;
    const bool ok = loader && t < ntiles;
    return Ent{(ok && j < ps.t1) ? pool_entry<PAGE>(idx, j) : -1,
               (ok && j + 32 < ps.t1) ? pool_entry<PAGE>(idx, j + 32) : -1};
  };
  auto issue = [&](int t, Ent e) {
    if (!loader) return;
    const unsigned st = smem0 + (t % STAGES) * TILE_BYTES + ld8_tok * 128 + ((ld8 ^ (ld8_tok & 7)) << 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int ent = h ? e.b : e.a;
      const long long row =
          ent < 0 ? -1ll
                  : (PAGE == 1 ? ent : static_cast<long long>(ent) * 64 + ((tok0(t) + ld8_tok + 32 * h) & 63));
      const unsigned char* src = kv + (row < 0 ? 0ll : row * ROW_BYTES) + ld8 * 16;
      const unsigned dst = st + h * 32 * 128;
#pragma unroll
      for (int k = 0; k < 4; ++k) cp_async16(dst + k * (BN * 128), src + k * 128, row >= 0);
      if (ld8 < 4) cp_async16(dst + 4 * (BN * 128), src + 512, row >= 0);
    }
  };
  using EntT = Ent;
#else
  auto row_of = [&](int t) -> int {  // -1: no token to load
    const int j = tok0(t) + ld_tok;
    return (loader && t < ntiles && j < ps.t1) ? pool_entry<PAGE>(idx, j) : -1;
  };
  using EntT = int;
  auto issue = [&](int t, int ent) {
    if (!loader) return;
    const long long row =
        ent < 0 ? -1ll : (PAGE == 1 ? ent : static_cast<long long>(ent) * 64 + ((tok0(t) + ld_tok) & 63));
    const unsigned char* src = kv + (row < 0 ? 0ll : row * ROW_BYTES) + ld_c * 16;
#if KV_FP8
    const unsigned st = smem0 + (t % STAGES) * TILE_BYTES;
    const unsigned d0 = st + ld_sw0, d1 = st + ld_sw1;
#pragma unroll
    for (int k = 0; k < LD_CH; ++k) cp_async16((k & 1 ? d1 : d0) + (k >> 1) * (BN * 128), src + k * 64, row >= 0);
#else
    const unsigned dst = smem0 + (t % STAGES) * TILE_BYTES + ld_tok * RS + ld_c * 16;
#pragma unroll
    for (int k = 0; k < LD_CH; ++k) cp_async16(dst + k * LD_TPT * 16, src + k * LD_TPT * 16, row >= 0);
#endif
  };
#endif

  EntT pre[STAGES - 1];
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) pre[s] = row_of(s);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles) issue(s, pre[s]);
    cp_async_commit();
  }
#if EARLY_Q && (KV_FP8 || QSMEM)
  store_q();  // the first tiles are in flight
#endif
  EntT nrow = row_of(STAGES - 1);  // prefetched one tile ahead of its issue

  float oacc[MT][NJ][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NJ; ++j) oacc[mt][j][0] = oacc[mt][j][1] = oacc[mt][j][2] = oacc[mt][j][3] = 0.f;

#if KV_FP8
  // P V: this lane's ldmatrix.trans row address in a tile, per 32-dim block u
  // (token (li&1)*8 + lr of the k-step, V chunk warp*4 + 2u + li/2, swizzled)
  unsigned v_off[NJ / 4];
#pragma unroll
  for (int u = 0; u < NJ / 4; ++u) {
    const int ch = warp * (DW / 16) + u * 2 + (li >> 1);
    v_off[u] = (ch >> 3) * (BN * 128) + ((li & 1) * 8 + lr) * 128 + (((ch & 7) ^ lr) << 4);
  }
  const unsigned long long q_desc = gmma_desc_sw128(q_s);
#endif

  // Softmax role: row sr, tokens [sc, sc + TPT) of each tile.
  const int sr = tid / TPR, sc = (tid % TPR) * TPT;
  const int lim_r = (MT > 1 && sr >= 16) ? ps.lim[MT - 1] : ps.lim[0];
  float m_run = ninf(), l_run = 0.f;

  for (int t = 0; t < ntiles; ++t) {
    cp_async_wait<STAGES - 2>();
#if KV_FP8
    fence_proxy_async();  // the landed tile is read by wgmma
#endif
    group_sync(grp);  // tile t landed for all; tile t-1's stage is free
    {
      const int tn = t + STAGES - 1;
      if (tn < ntiles) issue(tn, nrow);
      cp_async_commit();
      nrow = row_of(tn + 1);
    }
    const unsigned kt = smem0 + (t % STAGES) * TILE_BYTES;

#if KV_FP8
    // ---- S^T = K Q^T, warpgroup wg over dims [288*wg, +288) (qk_wgmma)
    {
      const int wg = warp >> 2;
      float sacc[ROWS / 2];
      const unsigned long long k_desc = gmma_desc_sw128(kt);
      if (wg == 0) {
        qk_wgmma<0>(sacc, k_desc, q_desc);
      } else {
        qk_wgmma<1>(sacc, k_desc, q_desc);
      }
      // thread holds tokens 16*(warp%4) + g (+8) of heads 8b + 2qd (+1)
      float* dst = sp + (wg * ROWS + 2 * qd) * SP_LD + 16 * (warp & 3) + g;
#pragma unroll
      for (int bb = 0; bb < ROWS / 8; ++bb) {
        float* d8 = dst + 8 * bb * SP_LD;
        d8[0] = sacc[4 * bb];
        d8[SP_LD] = sacc[4 * bb + 1];
        d8[8] = sacc[4 * bb + 2];
        d8[SP_LD + 8] = sacc[4 * bb + 3];
      }
    }
#else
    // ---- partial S over this warp's dims and tokens
    float sacc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n) sacc[mt][n][0] = sacc[mt][n][1] = sacc[mt][n][2] = sacc[mt][n][3] = 0.f;
#pragma unroll
    for (int c = 0; c < 9; ++c) {
      unsigned qa[MT][4];  // A fragments of k-step c
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#if QSMEM
        ldsm_x4(q_base + mt * 16 * RSQ + c * 32, qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
#else
        qa[mt][0] = qf[mt][c][0];
        qa[mt][1] = qf[mt][c][1];
        qa[mt][2] = qf[mt][c][2];
        qa[mt][3] = qf[mt][c][3];
#endif
      }
      if constexpr (NT == 2) {
        unsigned b0, b1, b2, b3;
        ldsm_x4(kt + (nw * TW + (li >> 1) * 8 + lr) * RS + (kw * 144 + c * 16 + (li & 1) * 8) * 2, b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(sacc[mt][0], qa[mt], b0, b1);
          mma_bf16(sacc[mt][NT - 1], qa[mt], b2, b3);
        }
      } else {
        unsigned b0, b1;
        ldsm_x2(kt + (nw * TW + lr) * RS + (kw * 144 + c * 16 + (li & 1) * 8) * 2, b0, b1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma_bf16(sacc[mt][0], qa[mt], b0, b1);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float* dst = sp + (kw * ROWS + mt * 16 + g) * SP_LD + nw * TW + n * 8 + 2 * qd;
        *reinterpret_cast<float2*>(dst) = make_float2(sacc[mt][n][0], sacc[mt][n][1]);
        *reinterpret_cast<float2*>(dst + 8 * SP_LD) = make_float2(sacc[mt][n][2], sacc[mt][n][3]);
      }
#endif
    group_sync(grp);

    // ---- online softmax of row sr over this tile
    {
      float s[TPT];
#pragma unroll
      for (int e = 0; e < TPT; ++e) s[e] = 0.f;
#pragma unroll
      for (int k = 0; k < KPARTS; ++k) {
        const float* src = sp + (k * ROWS + sr) * SP_LD + sc;
        if constexpr (TPT == 1) {
          s[0] += *src;
        } else if constexpr (TPT == 2) {
          const float2 v = *reinterpret_cast<const float2*>(src);
          s[0] += v.x;
          s[1] += v.y;
        } else {
#pragma unroll
          for (int e = 0; e < TPT; e += 4) {
            const float4 v = *reinterpret_cast<const float4*>(src + e);
            s[e] += v.x;
            s[e + 1] += v.y;
            s[e + 2] += v.z;
            s[e + 3] += v.w;
          }
        }
      }
      const int tb = tok0(t) + sc;
      float mx = ninf();
#pragma unroll
      for (int e = 0; e < TPT; ++e) {
        s[e] = (tb + e < lim_r) ? s[e] * scale_log2 : ninf();
        mx = fmaxf(mx, s[e]);
      }
#pragma unroll
      for (int off = TPR / 2; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_run, mx);
      const float m_use = (m_new == ninf()) ? 0.f : m_new;
      const float alpha = exp2f(m_run - m_use);
      float sum = 0.f;
      unsigned pk[(TPT + 1) / 2];
#pragma unroll
      for (int e = 0; e < TPT; e += 2) {
        const float p0 = exp2f(s[e] - m_use), p1 = TPT > 1 ? exp2f(s[(e + 1) % TPT] - m_use) : 0.f;
        sum += p0 + p1;
#if KV_FP8
        pk[e / 2] = pack_f16x2(p0, p1);
#else
        pk[e / 2] = pack_bf16x2(p0, p1);
#endif
      }
      unsigned short* pdst = psm + sr * PS_LD + sc;
      if constexpr (TPT == 1) {
        *pdst = static_cast<unsigned short>(pk[0] & 0xFFFFu);
      } else if constexpr (TPT == 2) {
        *reinterpret_cast<unsigned*>(pdst) = pk[0];
      } else if constexpr (TPT == 4) {
        *reinterpret_cast<uint2*>(pdst) = make_uint2(pk[0], pk[1]);
      } else {
        *reinterpret_cast<uint4*>(pdst) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
      }
#pragma unroll
      for (int off = TPR / 2; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      l_run = l_run * alpha + sum;
      m_run = m_new;
      if ((tid % TPR) == 0) alpha_s[sr] = alpha;
    }
    group_sync(grp);

    // ---- O = alpha * O + P V over this warp's 64 output dims
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float a0 = alpha_s[mt * 16 + g], a8 = alpha_s[mt * 16 + g + 8];
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        oacc[mt][j][0] *= a0;
        oacc[mt][j][1] *= a0;
        oacc[mt][j][2] *= a8;
        oacc[mt][j][3] *= a8;
      }
    }
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) {
      unsigned pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldsm_x4(ps_base + ((mt * 16 + (li & 1) * 8 + lr) * PS_LD + ks * 16 + (li >> 1) * 8) * 2, pa[mt][0], pa[mt][1],
                pa[mt][2], pa[mt][3]);
#if KV_FP8
#pragma unroll
      for (int u = 0; u < NJ / 4; ++u) {
        unsigned r0, r1, r2, r3;
        ldsm_x4_t(kt + v_off[u] + ks * 16 * 128, r0, r1, r2, r3);
        unsigned e0, o0, e1, o1, e2, o2, e3, o3;
        v_cvt(r0, e0, o0);  // tokens 0-7 of dims [32u, +16)
        v_cvt(r1, e1, o1);  // tokens 8-15
        v_cvt(r2, e2, o2);  // tokens 0-7 of dims [32u+16, +16)
        v_cvt(r3, e3, o3);  // tokens 8-15
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_f16(oacc[mt][u * 4 + 0], pa[mt], e0, e1);
          mma_f16(oacc[mt][u * 4 + 1], pa[mt], o0, o1);
          mma_f16(oacc[mt][u * 4 + 2], pa[mt], e2, e3);
          mma_f16(oacc[mt][u * 4 + 3], pa[mt], o2, o3);
        }
      }
#else
      const int vtok = ks * 16 + (li & 1) * 8 + lr;
#pragma unroll
      for (int p = 0; p < NJ / 2; ++p) {
        unsigned b0, b1, b2, b3;
        ldsm_x4_t(kt + vtok * RS + (warp * DW + p * 16 + (li >> 1) * 8) * 2, b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(oacc[mt][2 * p], pa[mt], b0, b1);
          mma_bf16(oacc[mt][2 * p + 1], pa[mt], b2, b3);
        }
      }
#endif
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: LSE from the softmax threads, O from the PV warps.
  // With two groups, both publish (m, l) per row and group 1 its O (into its
  // own ring, free now); group 0 rescales both to the common max and stores.
  // fin[r] = weight of group 0's O of row r, fin[ROWS + r] = of group 1's,
  // fin[2*ROWS + r] = the merged l (one group: weight 1, l).
  float* fin = sp;  // group 0's S scratch, unused after the loop
  if constexpr (GROUPS == 2) {
    group_sync(grp);  // this group's ring and scratch are no longer read
    if ((tid % TPR) == 0) {
      alpha_s[sr] = m_run;
      l_s[sr] = l_run;
    }
    if (grp == 1) {
      float* o1 = reinterpret_cast<float*>(smem + RING_BYTES);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) o1[((mt * NJ + j) * 4 + e) * GTHREADS + tid] = oacc[mt][j][e];
    }
    __syncthreads();
    if (grp == 0 && (tid % TPR) == 0) {
      const float* scr1 = reinterpret_cast<const float*>(smem + OFF_SCR + SCR_BYTES);
      const float m1 = scr1[SCR_AL / 4 + sr], l1 = scr1[SCR_L / 4 + sr];
      const float m = fmaxf(m_run, m1);
      const float m_use = (m == ninf()) ? 0.f : m;
      const float a0 = exp2f(m_run - m_use), a1 = exp2f(m1 - m_use);
      m_run = m;
      l_run = l_run * a0 + l1 * a1;
      fin[sr] = a0;
      fin[ROWS + sr] = a1;
      fin[2 * ROWS + sr] = l_run;
    }
  } else {
    if ((tid % TPR) == 0) {
      fin[sr] = 1.f;
      fin[2 * ROWS + sr] = l_run;
    }
  }
  if (grp == 0 && (tid % TPR) == 0) {
    const bool hi = MT > 1 && sr >= 16;  // selects, not a run-time index: keeps ps in registers
    const int valid = hi ? ps.valid[MT - 1] : ps.valid[0];
    const long long orow = hi ? ps.o_row[MT - 1] : ps.o_row[0];
    if (valid) lse[orow + (sr & 15)] = l_run > 0.f ? (m_run + log2f(l_run)) * LN2 : ninf();
  }
  group_sync(grp);
  if (grp == 0) {
    if constexpr (GROUPS == 2) {
      const float* o1 = reinterpret_cast<const float*>(smem + RING_BYTES);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const float a0 = fin[mt * 16 + g], a8 = fin[mt * 16 + g + 8];
        const float b0 = fin[ROWS + mt * 16 + g], b8 = fin[ROWS + mt * 16 + g + 8];
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const float* src = o1 + (mt * NJ + j) * 4 * GTHREADS + tid;
          oacc[mt][j][0] = oacc[mt][j][0] * a0 + src[0] * b0;
          oacc[mt][j][1] = oacc[mt][j][1] * a0 + src[GTHREADS] * b0;
          oacc[mt][j][2] = oacc[mt][j][2] * a8 + src[2 * GTHREADS] * b8;
          oacc[mt][j][3] = oacc[mt][j][3] * a8 + src[3 * GTHREADS] * b8;
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (!ps.valid[mt]) continue;
      const float l0 = fin[2 * ROWS + mt * 16 + g], l8 = fin[2 * ROWS + mt * 16 + g + 8];
      const float i0 = l0 > 0.f ? out_scale / l0 : 0.f, i8 = l8 > 0.f ? out_scale / l8 : 0.f;
      const long long row0 = ps.o_row[mt] + g, row8 = row0 + 8;
#if KV_FP8
      // n8 tile (block D, parity e) column n holds dim D + 2n + e, so this
      // thread owns dims D + 4qd .. +3 of rows g and g+8.
#pragma unroll
      for (int j = 0; j < NJ; j += 2) {
        const int dim = warp * DW + (j >> 2) * 32 + ((j >> 1) & 1) * 16 + 4 * qd;
        const float* ev = oacc[mt][j];
        const float* od = oacc[mt][j + 1];
        const float4 v0 = make_float4(ev[0] * i0, od[0] * i0, ev[1] * i0, od[1] * i0);
        const float4 v8 = make_float4(ev[2] * i8, od[2] * i8, ev[3] * i8, od[3] * i8);
        if (to_part) {
          *reinterpret_cast<float4*>(part_o + row0 * D_V + dim) = v0;
          *reinterpret_cast<float4*>(part_o + row8 * D_V + dim) = v8;
        } else {
          *reinterpret_cast<uint2*>(o + row0 * D_V + dim) = make_uint2(pack_bf16x2(v0.x, v0.y), pack_bf16x2(v0.z, v0.w));
          *reinterpret_cast<uint2*>(o + row8 * D_V + dim) = make_uint2(pack_bf16x2(v8.x, v8.y), pack_bf16x2(v8.z, v8.w));
        }
      }
#else
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int dim = warp * DW + j * 8 + 2 * qd;
        const float* c = oacc[mt][j];
        if (to_part) {
          *reinterpret_cast<float2*>(part_o + row0 * D_V + dim) = make_float2(c[0] * i0, c[1] * i0);
          *reinterpret_cast<float2*>(part_o + row8 * D_V + dim) = make_float2(c[2] * i8, c[3] * i8);
        } else {
          *reinterpret_cast<unsigned*>(o + row0 * D_V + dim) = pack_bf16x2(c[0] * i0, c[1] * i0);
          *reinterpret_cast<unsigned*>(o + row8 * D_V + dim) = pack_bf16x2(c[2] * i8, c[3] * i8);
        }
      }
#endif
    }
  }  // grp == 0
  __syncthreads();  // the next pass reuses the shared buffers
}

}  // namespace mla
