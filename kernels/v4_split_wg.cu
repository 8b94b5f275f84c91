// v4_split on the compute-bound core (common/mla_wg.cuh, common/wg_v4.cuh)
// for 64 and 128 heads: every (head group, row, split) CTA computes 64 heads
// of one row over its split of the row's KV list on bf16 wgmma and writes an
// f32 partial without the sink; split_merge (merge.cu) adds the sink once.
// Same ABI as v4_split.cu except the block: kernels/ABI.md.
// Defines: HK (64 or 128), KV_FP8=1, WG_V4=1.
#include "common/v4_split_range.cuh"
#include "common/wg_v4.cuh"

using namespace mla;

static_assert(HK == 64 || HK == 128, "the V4 wgmma core runs 64 or 128 heads");

namespace {

// Every row of the block sees the whole split (causality is in the list).
struct V4Rows {
  int t_end;
  long long out0;
  __device__ int lim(int) const { return t_end; }
  __device__ long long o_row(int r) const { return out0 + r; }
};

}  // namespace

// grid (HK/64, rows, n), block 384; the split rule: common/v4_split_range.cuh.
// An empty split (pad rows included)
// writes only its LSE (-inf), which is all split_merge reads of it.
extern "C" __global__ void __launch_bounds__(wg::THREADS, 1)
    v4_split(const unsigned char* __restrict__ q_packed, const __nv_bfloat16* __restrict__ q_rope,
             const unsigned char* __restrict__ pool_packed, const __nv_bfloat16* __restrict__ pool_rope,
             const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
             const int* __restrict__ split_indptr, float sm_scale, int rows, float* __restrict__ part_o,
             float* __restrict__ part_lse) {
  extern __shared__ __align__(1024) unsigned char smem[];
  wg::check_launch();
  const int h0 = blockIdx.x * wg::BM, row = blockIdx.y;
  v4split::Range sr;
  if (!v4split::split_range(split_indptr, kv_indptr, row, blockIdx.z, rows, sr)) return;
  if (sr.b <= sr.a) {
    if (threadIdx.x < wg::BM) part_lse[sr.slot() * HK + h0 + threadIdx.x] = ninf();
    return;
  }
  const unsigned base = wg::setup(smem);
  wg::Pass ps;
  ps.q_row0 = static_cast<long long>(row) * HK + h0;
  ps.nrows = wg::BM;
  ps.t0 = static_cast<int>(sr.a);
  ps.t_end = static_cast<int>(sr.b);
  ps.idx = kv_indices + sr.beg;
  ps.prefetch = true;
  wg::Phase ph;
  if (wg::warpgroup() == 2) {
    wg::regs_dec<wg::PRODUCER_REGS>();
    wg::produce_v4(base, ps, ph, wg::V4Src{q_packed, q_rope, pool_packed, pool_rope});
  } else {
    wg::regs_inc<wg::CONSUMER_REGS>();
    const V4Rows rw{ps.t_end, sr.slot() * HK + h0};
    wg::consume<V4Rows, false, true>(base, ps, rw, ph, sm_scale * LOG2E, 1.f, true, nullptr, part_o, part_lse);
  }
}
