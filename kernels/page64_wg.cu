// page64 on the compute-bound core (common/mla_wg.cuh): non-persistent MLA
// decode, page size 64, bottom-right mask on local positions, the SPEC's
// split rule; f32 partials + page64_merge, for rows = HK x s_q >= 64, bf16 or fp8.
// bf16 pages come by TMA (the last parameter, a tensor map of the pool),
// issued by the consumers: no producer warpgroup (WG_SELF).
// ABI: kernels/ABI.md. Defines: HK, KV_FP8 (0 bf16, 1 e4m3).
#if !KV_FP8
#define WG_TMA 1
#define WG_SELF 1
#endif
#include "common/mla_wg.cuh"
#include "common/page64_merge.cuh"
#include "common/pdl.cuh"

using namespace mla;

namespace {

// Row r of row block rb of one (split, sequence): flattened row R = position
// * HK + head; its local bottom-right limit and output row.
struct Page64Rows {
  int rb, rows, len, s_q, t1, n_splits, s;
  long long qo0;
  bool to_part;
  __device__ int lim(int r) const {
    const int R = rb * wg::BM + r;
    if (R >= rows) return 0;
    return min(max(len - s_q + R / HK + 1, 0), t1);
  }
  __device__ long long o_row(int r) const {
    const int R = rb * wg::BM + r;
    return to_part ? ((qo0 + R / HK) * n_splits + s) * HK + R % HK : qo0 * HK + R;
  }
};

}  // namespace

// grid (n_rb, n_splits, B), block 384. Split s of a length-len sequence
// covers [s*chunk, min((s+1)*chunk, len)), chunk = ceil(ceil(len/64)/n)*64;
// the n_rb row blocks of a split are adjacent CTAs, so they share its KV in L2.
extern "C" __global__ void __launch_bounds__(wg::THREADS, 1)
    page64_fwd(const unsigned char* __restrict__ q, const unsigned char* __restrict__ kv,
               const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
               const int* __restrict__ kv_last_page_len, const int* __restrict__ qo_indptr, float q_scale,
               float kv_scale, float sm_scale, int n_splits, __nv_bfloat16* __restrict__ o,
               float* __restrict__ lse, float* __restrict__ part_o, float* __restrict__ part_lse
#if WG_TMA
               ,
               const __grid_constant__ wg::TileMap pages
#endif
    ) {
  extern __shared__ __align__(1024) unsigned char smem[];
  wg::check_launch();
  const int rb = blockIdx.x, s = blockIdx.y, b = blockIdx.z;
  const int qo0 = qo_indptr[b], s_q = qo_indptr[b + 1] - qo0;
  const int rows = s_q * HK;
  if (rb * wg::BM >= rows) return;  // before any barrier: the whole CTA leaves
  const unsigned base = wg::setup(smem);
  pdl_launch_dependents();
  const float scale_log2 = sm_scale * q_scale * kv_scale * LOG2E;
  const int p0 = kv_indptr[b], np = kv_indptr[b + 1] - p0;
  const int len = np > 0 ? (np - 1) * 64 + kv_last_page_len[b] : 0;
  const int chunk = ((np + n_splits - 1) / n_splits) * 64;
  const int t0 = min(s * chunk, len), t1 = min(t0 + chunk, len);
  const bool to_part = n_splits > 1;
  const Page64Rows rw{rb, rows, len, s_q, t1, n_splits, s, qo0, to_part};
  wg::Pass ps;
  ps.q_row0 = static_cast<long long>(qo0) * HK + rb * wg::BM;
  ps.nrows = min(wg::BM, rows - rb * wg::BM);
  ps.t0 = t0;
  ps.t_end = max(t0, rw.lim(ps.nrows - 1));
  ps.idx = kv_indices + p0;
  // L2 prefetch of the next pair: fp8, or bf16 where this sequence's row
  // blocks share the split's KV, each pair by one of them (docs/kernels.md,
  // "L2 prefetch").
  ps.pf_n = (rows + wg::BM - 1) / wg::BM;
  ps.pf_k = rb;
  ps.prefetch = KV_FP8 || ps.pf_n > 1;
#if WG_TMA
  ps.pages = &pages;
#endif
  wg::Phase ph;
  if (wg::warpgroup() == 2) {
    wg::regs_dec<wg::PRODUCER_REGS>();
#if !WG_SELF
    wg::produce<64>(base, ps, ph, q, kv);
#endif
  } else {
    wg::regs_inc<wg::CONSUMER_REGS>();
    wg::consume(base, ps, rw, ph, scale_log2, kv_scale, to_part, o, part_o, to_part ? part_lse : lse, q, kv);
  }
}
