// hca_persist on the compute-bound core (common/mla_wg.cuh, common/wg_v4.cuh)
// for 128 heads: the same in-kernel plan as hca_persist.cu
// (common/hca_parts.cuh), but each (head group, partition) CTA streams its
// rows' pieces through the wgmma core, 64 heads per pass on bf16 wgmma, the
// producer warpgroup running ahead into the next piece while the consumers
// finish this one. A row inside the partition is written with the sink; a
// cut row leaves an f32 partial in slot 2p or 2p + 1, and the CTA that
// brings the row's 16-bit head-group field of counters[row] to `pieces`
// merges every piece from L2 and subtracts the field back to 0. Nobody
// waits on anybody, so any CTA order is safe.
// The two head groups of a partition are one 2-CTA cluster (WG_PAIR in
// common/mla_wg.cuh): they stream the same tokens, so each producer
// dequantizes half of every tile for both.
// Same ABI as hca_persist.cu except the block: kernels/ABI.md.
// Defines: HK (128), KV_FP8=1, WG_V4=1, HCA_MIN_TOKENS.
#define WG_PAIR 1
#include "common/hca_parts.cuh"
#include "common/wg_v4.cuh"

using namespace mla;

static_assert(HK == 128, "hca_persist runs 128 heads");

namespace {

constexpr int NB_STORED = 6;  // every consumer's partial is stored and fenced
constexpr int NB_LAST = 7;    // the counter said whether this CTA merges

// The OR of `v` over the n threads meeting at named barrier `id`.
__device__ __forceinline__ bool nbar_or(int id, int n, bool v) {
  int r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.s32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.s32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(static_cast<int>(v)), "r"(id), "r"(n)
      : "memory");
  return r != 0;
}

// The last finisher of (row r, head group h0) merges all of the row's
// pieces from the workspace (its own included): consumer thread t takes
// head t / 4 and the 16-byte chunks t % 4 + 4j of its 512 dims, so each
// quad reads 64 contiguous bytes per load. Writes bf16 o and lse with the sink.
__device__ void merge_row(int r, int h0, long long st, long long en, long long total, int parts,
                          const float* __restrict__ o_acc, const float* __restrict__ lse_acc,
                          const float* __restrict__ sink, __nv_bfloat16* __restrict__ o, float* __restrict__ lse) {
  const int t = threadIdx.x, head = h0 + (t >> 2), q4 = t & 3;
  const int pf = hca::part_of(st, total, parts), pl = hca::part_of(en - 1, total, parts);
  const float sk = sink ? sink[head] * LOG2E : ninf();
  float M = sk;
  for (int q = pf; q <= pl; ++q) {
    const long long b0 = hca::bound(q, total, parts);
    if (hca::bound(q + 1, total, parts) <= b0) continue;
    M = fmaxf(M, __ldcg(lse_acc + static_cast<long long>(hca::piece_slot(q, b0, st)) * HK + head) * LOG2E);
  }
  const bool any = M != ninf();
  float den = any ? exp2f(sk - M) : 0.f;
  float4 acc[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int q = pf; q <= pl; ++q) {
    const long long b0 = hca::bound(q, total, parts);
    if (hca::bound(q + 1, total, parts) <= b0) continue;
    const long long row = static_cast<long long>(hca::piece_slot(q, b0, st)) * HK + head;
    const float w = any ? exp2f(__ldcg(lse_acc + row) * LOG2E - M) : 0.f;
    den += w;
    const float4* src = reinterpret_cast<const float4*>(o_acc + row * D_V) + q4;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float4 v = __ldcg(src + 4 * j);
      acc[j].x += w * v.x;
      acc[j].y += w * v.y;
      acc[j].z += w * v.z;
      acc[j].w += w * v.w;
    }
  }
  const float inv = den > 0.f ? 1.f / den : 0.f;
  uint2* dst = reinterpret_cast<uint2*>(o + (static_cast<long long>(r) * HK + head) * D_V) + q4;
#pragma unroll
  for (int j = 0; j < 32; ++j)
    dst[4 * j] = make_uint2(pack_bf16x2(acc[j].x * inv, acc[j].y * inv), pack_bf16x2(acc[j].z * inv, acc[j].w * inv));
  if (q4 == 0) lse[static_cast<long long>(r) * HK + head] = any ? (M + log2f(den)) * LN2 : ninf();
}

}  // namespace

// grid (HK/64, P), block 384, dynamic smem wg::SMEM_BYTES. As hca_persist.cu:
// parts (P) <= 4096, the call uses P_eff <= P partitions and the rest exit;
// o_acc [2P, HK, 512] f32, lse_acc [2P, HK] f32, counters [>= n_rows] i32
// zero at rest (left zero). Rows of length 0 are not written.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(wg::THREADS, 1)
    hca_persist(const unsigned char* __restrict__ q_packed, const __nv_bfloat16* __restrict__ q_rope,
                const unsigned char* __restrict__ pool_packed, const __nv_bfloat16* __restrict__ pool_rope,
                const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
                const float* __restrict__ sink, float sm_scale, int n_rows, int parts, float* o_acc,
                float* lse_acc, int* counters, __nv_bfloat16* o, float* lse) {
  extern __shared__ __align__(1024) unsigned char smem[];
  wg::check_launch();
  const int h0 = blockIdx.x * wg::BM, p = blockIdx.y;
  if (n_rows <= 0 || p >= parts) return;
  // Offsets fit in int (kv_indptr is int); 32-bit keeps the producer,
  // at its register limit, from spilling in the row loop.
  const int base = kv_indptr[0];
  const int total = kv_indptr[n_rows] - base;
  if (total <= 0) return;
  // Warp-uniform through shuffles: the compiler takes an asm result
  // (%nsmid here) and the block-wide search as divergent, and serialises
  // wgmma behind a branch it thinks divergent.
  const int pe = __shfl_sync(0xffffffffu, hca::effective_parts(total, parts), 0);
  if (p >= pe) return;
  const int lo = static_cast<int>(hca::bound(p, total, pe)), hi = static_cast<int>(hca::bound(p + 1, total, pe));
  if (lo >= hi) return;
  // Every exit above is taken by both CTAs of the cluster (they differ in
  // blockIdx.x alone); past setup() neither leaves before the other's
  // last arrival on its barriers (cluster_arrive / cluster_wait).
  const int first = __shfl_sync(0xffffffffu, hca::find_row<wg::THREADS>(kv_indptr, n_rows, base, lo), 0);
  const unsigned sbase = wg::setup(smem);
  const int shift = 16 * static_cast<int>(blockIdx.x);  // this head group's counter field
  // Row r's piece in this partition: 0 past the partition, 1 an empty row,
  // 2 a pass to run. Both roles walk the rows the same way.
  auto piece = [&](int r, wg::Pass& ps, int& st, int& en) -> int {
    st = kv_indptr[r] - base;
    en = kv_indptr[r + 1] - base;
    if (st >= hi) return 0;
    if (en <= st) return 1;
    ps.q_row0 = static_cast<long long>(r) * HK + h0;
    ps.nrows = wg::BM;
    ps.t0 = max(st, lo) - st;
    ps.t_end = min(en, hi) - st;
    ps.idx = kv_indices + base + st;
    ps.prefetch = true;
    return 2;
  };
  wg::Phase ph;
  if (wg::warpgroup() == 2) {
    wg::regs_dec<wg::PRODUCER_REGS>();
    const wg::V4Src src{q_packed, q_rope, pool_packed, pool_rope};
    for (int r = first; r < n_rows; ++r) {
      wg::Pass ps;
      int st, en;
      const int k = piece(r, ps, st, en);
      if (k == 0) break;
      if (k == 2) wg::produce_v4(sbase, ps, ph, src);
    }
    cluster_arrive();
    return;
  }
  wg::regs_inc<wg::CONSUMER_REGS>();
  // Rows this CTA merges: only the partition's first and last rows can be
  // cut, so at most two. Merging after the loop keeps the merge's registers
  // and its data-dependent branch out of the wgmma loop (ptxas otherwise
  // serialises every wgmma: C7520).
  int m0 = -1, m1 = -1;
  for (int r = first; r < n_rows; ++r) {
    wg::Pass ps;
    int st, en;
    const int k = piece(r, ps, st, en);
    if (k == 0) break;
    if (k == 1) continue;
    const bool whole = st >= lo && en <= hi;
    const long long out0 = static_cast<long long>(whole ? r : hca::piece_slot(p, lo, st)) * HK + h0;
    const wg::V4Rows rw{ps.t_end, out0, whole ? sink : nullptr, h0};
    wg::consume<wg::V4Rows, true>(sbase, ps, rw, ph, sm_scale * LOG2E, 1.f, !whole, o, o_acc, whole ? lse : lse_acc);
    if (whole) continue;
    __threadfence();
    nbar_sync(NB_STORED, wg::CONSUMERS);
    bool last = false;
    if (threadIdx.x == 0) {
      const int pieces = hca::row_pieces(st, en, total, pe);
      const int old = atomicAdd(counters + r, 1 << shift);
      last = ((old >> shift) & 0xffff) == pieces - 1;
      // Every piece of this group has arrived: take the group's share back
      // out now (atomically: the other group may still be counting).
      if (last) atomicSub(counters + r, pieces << shift);
    }
    const bool mine = nbar_or(NB_LAST, wg::CONSUMERS, last);
    m1 = mine && m0 >= 0 ? r : m1;
    m0 = mine && m0 < 0 ? r : m0;
  }
  cluster_arrive();  // past this warp's last arrival on the peer's barriers
  if (m0 >= 0) {
    __threadfence();
    for (const int r : {m0, m1}) {
      if (r < 0) break;
      const int st = kv_indptr[r] - base, en = kv_indptr[r + 1] - base;
      merge_row(r, h0, st, en, total, pe, o_acc, lse_acc, sink, o, lse);
    }
  }
  cluster_wait();  // the peer's consumers are done with this CTA's barriers
}
