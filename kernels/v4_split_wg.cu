// v4_split on the compute-bound core (common/mla_wg.cuh, common/wg_v4.cuh)
// for 64 and 128 heads: every (head group, row, split) CTA computes 64 heads
// of one row over its split of the row's KV list on bf16 wgmma and writes an
// f32 partial without the sink; split_merge (merge.cu) adds the sink once.
// A plan of one split a row takes v4_split_one, which writes o itself.
// Same ABI as v4_split.cu except the block: kernels/ABI.md.
// Defines: HK (64 or 128), KV_FP8=1, WG_V4=1.
#include "common/pdl.cuh"
#include "common/v4_split_range.cuh"
#include "common/wg_v4.cuh"

using namespace mla;

static_assert(HK == 64 || HK == 128, "the V4 wgmma core runs 64 or 128 heads");

namespace {

// One pass of 64 heads over the CTA's range: the producer warpgroup loads
// and dequantizes, the consumers write `rw`'s rows through shared memory,
// as f32 partials without the sink (PART) or as bf16 o with it.
template <bool PART>
__device__ __forceinline__ void run_pass(unsigned base, const wg::Pass& ps, const wg::V4Src& src,
                                         const wg::V4Rows& rw, float sm_scale, __nv_bfloat16* o, float* part_o,
                                         float* lse) {
  wg::Phase ph;
  if (wg::warpgroup() == 2) {
    wg::regs_dec<wg::PRODUCER_REGS>();
    wg::produce_v4(base, ps, ph, src);
  } else {
    wg::regs_inc<wg::CONSUMER_REGS>();
    wg::consume<wg::V4Rows, !PART, true>(base, ps, rw, ph, sm_scale * LOG2E, 1.f, PART, o, part_o, lse);
  }
}

}  // namespace

// grid (HK/64, rows, n), block 384; the split rule and the order of the
// pieces (longest first): common/v4_split_range.cuh.
// An empty split (pad rows included)
// writes only its LSE (-inf), which is all split_merge reads of it.
extern "C" __global__ void __launch_bounds__(wg::THREADS, 1)
    v4_split(const unsigned char* __restrict__ q_packed, const __nv_bfloat16* __restrict__ q_rope,
             const unsigned char* __restrict__ pool_packed, const __nv_bfloat16* __restrict__ pool_rope,
             const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
             const int* __restrict__ split_indptr, float sm_scale, int rows, float* __restrict__ part_o,
             float* __restrict__ part_lse, int longest_first) {
  extern __shared__ __align__(1024) unsigned char smem[];
  wg::check_launch();
  pdl_launch_dependents();  // split_merge may start; it waits for the partials
  const int h0 = blockIdx.x * wg::BM;
  int row, s;
  v4split::lpt_piece(split_indptr, kv_indptr, rows, longest_first, reinterpret_cast<int*>(smem), row, s);
  v4split::Range sr;
  if (!v4split::split_range(split_indptr, kv_indptr, row, s, rows, sr)) return;
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
  const wg::V4Rows rw{ps.t_end, sr.slot() * HK + h0, nullptr, h0};
  run_pass<true>(base, ps, wg::V4Src{q_packed, q_rope, pool_packed, pool_rope}, rw, sm_scale, nullptr, part_o,
                 part_lse);
}

// v4_split for a plan of one split in every row (the host's pick): a CTA's
// pass is its whole row, so it adds the sink and writes bf16 o and lse
// itself, and neither f32 partials nor split_merge follow; aiter's decode
// also returns its first stage's output when num_kv_splits == 1. A row of
// length 0 (pad rows) gets split_merge's result: o = 0, lse = the sink.
// grid (HK/64, rows), block 384; arguments as split_merge's around
// v4_split's (kernels/ABI.md).
extern "C" __global__ void __launch_bounds__(wg::THREADS, 1)
    v4_split_one(const unsigned char* __restrict__ q_packed, const __nv_bfloat16* __restrict__ q_rope,
                 const unsigned char* __restrict__ pool_packed, const __nv_bfloat16* __restrict__ pool_rope,
                 const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
                 const float* __restrict__ sink, float sm_scale, int rows, __nv_bfloat16* __restrict__ o,
                 float* __restrict__ lse, int longest_first) {
  extern __shared__ __align__(1024) unsigned char smem[];
  wg::check_launch();
  const int h0 = blockIdx.x * wg::BM;
  int row, s;
  v4split::lpt_piece(nullptr, kv_indptr, rows, longest_first, reinterpret_cast<int*>(smem), row, s);
  if (row >= rows) return;
  const int beg = kv_indptr[row], len = kv_indptr[row + 1] - beg;
  const long long out0 = static_cast<long long>(row) * HK + h0;
  if (len <= 0) {
    V4_SPLIT_EMPTY_ROW(wg::BM, wg::THREADS, sink, h0, out0, o, lse);
    return;
  }
  const unsigned base = wg::setup(smem);
  wg::Pass ps;
  ps.q_row0 = out0;
  ps.nrows = wg::BM;
  ps.t0 = 0;
  ps.t_end = len;
  ps.idx = kv_indices + beg;
  ps.prefetch = true;
  const wg::V4Rows rw{len, out0, sink, h0};
  run_pass<false>(base, ps, wg::V4Src{q_packed, q_rope, pool_packed, pool_rope}, rw, sm_scale, o, nullptr, lse);
}
