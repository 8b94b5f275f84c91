// ps1 on the compute-bound core (common/mla_wg.cuh): persistent MLA decode,
// page size 1, causal mask on global (DCP round-robin) positions, host-built
// work list; f32 partials + ps1_reduce, for rows = HK x s_q >= 64, bf16 or fp8.
// ABI: kernels/ABI.md. Defines: HK, KV_FP8 (0 bf16, 1 e4m3).
#include "common/mla_wg.cuh"
#include "common/pdl.cuh"
#include "common/ps1_reduce.cuh"

using namespace mla;

namespace {

// Row r of row block rb of one work item: its global-mask limit and output row.
struct Ps1Rows {
  int rb, rows, q_start, qo0, s_q, L, kv_start, kv_end, W, rank, S;
  long long out0;
  __device__ int lim(int r) const {
    const int R = rb * wg::BM + r;
    if (R >= rows) return kv_start;
    const int ii = q_start - qo0 + R / HK;  // query position within the sequence
    return min(kv_end, dcp_local_len(rank, L - s_q + ii + 1, W, S));
  }
  __device__ long long o_row(int r) const { return out0 + rb * wg::BM + r; }
};

}  // namespace

// grid (n_groups * n_rb): CTA g * n_rb + rb runs row block rb of every item
// of group g, work_indptr[g] .. work_indptr[g+1] (an item is 8 ints: seq,
// partial, q_start, q_end, kv_start, kv_end, 0, 0). The n_rb CTAs of a
// group read the same KV tiles at the same time, so they share them in L2.
extern "C" __global__ void __launch_bounds__(wg::THREADS, 1)
    ps1_fwd(const unsigned char* __restrict__ q, const unsigned char* __restrict__ kv,
            const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
            const int* __restrict__ qo_indptr, const int* __restrict__ g_kv_indptr,
            const int* __restrict__ work_indptr, const int* __restrict__ work_items, float q_scale,
            float kv_scale, float sm_scale, int W, int rank, int S, __nv_bfloat16* __restrict__ o,
            float* __restrict__ lse, float* __restrict__ part_o, float* __restrict__ part_lse, int n_rb) {
  extern __shared__ __align__(1024) unsigned char smem[];
  wg::check_launch();
  const unsigned base = wg::setup(smem);
  pdl_launch_dependents();
  const float scale_log2 = sm_scale * q_scale * kv_scale * LOG2E;
  const int grp = blockIdx.x / n_rb, rb = blockIdx.x % n_rb;
  const int w_begin = work_indptr[grp], w_end = work_indptr[grp + 1];
  wg::Phase ph;
  auto item = [&](int w, wg::Pass& ps, Ps1Rows& rw) -> bool {
    const int4* it = reinterpret_cast<const int4*>(work_items) + 2ll * w;
    const int4 i0 = __ldg(it), i1 = __ldg(it + 1);
    const int b = i0.x, partial = i0.y, q_start = i0.z, q_end = i0.w, kv_start = i1.x, kv_end = i1.y;
    const int rows = (q_end - q_start) * HK;
    if (rb * wg::BM >= rows) return false;
    const int qo0 = qo_indptr[b];
    rw = Ps1Rows{rb,
                 rows,
                 q_start,
                 qo0,
                 qo_indptr[b + 1] - qo0,
                 g_kv_indptr[b + 1] - g_kv_indptr[b],
                 kv_start,
                 kv_end,
                 W,
                 rank,
                 S,
                 static_cast<long long>(partial >= 0 ? partial : q_start) * HK};
    ps.q_row0 = static_cast<long long>(q_start) * HK + rb * wg::BM;
    ps.nrows = min(wg::BM, rows - rb * wg::BM);
    ps.t0 = kv_start;
    ps.t_end = max(kv_start, rw.lim(ps.nrows - 1));  // limits grow with the row
    ps.idx = kv_indices + kv_indptr[b];
    ps.prefetch = KV_FP8 || n_rb > 1;  // fp8, or several row blocks sharing the item's KV
    ps.pf_n = (rows + wg::BM - 1) / wg::BM;
    ps.pf_k = rb;
    return true;
  };
  if (wg::warpgroup() == 2) {
    wg::regs_dec<wg::PRODUCER_REGS>();
    for (int w = w_begin; w < w_end; ++w) {
      wg::Pass ps;
      Ps1Rows rw;
      if (item(w, ps, rw)) wg::produce<1>(base, ps, ph, q, kv);
    }
  } else {
    wg::regs_inc<wg::CONSUMER_REGS>();
    for (int w = w_begin; w < w_end; ++w) {
      wg::Pass ps;
      Ps1Rows rw;
      if (!item(w, ps, rw)) continue;
      const bool to_part = __ldg(work_items + 8ll * w + 1) >= 0;
      wg::consume(base, ps, rw, ph, scale_log2, kv_scale, to_part, o, part_o, to_part ? part_lse : lse);
    }
  }
}
