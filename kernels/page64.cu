// page64: non-persistent MLA decode fallback, page size 64, bottom-right
// mask on local positions; grid over (head group of 16, split, sequence);
// f32 partials + page64_merge when n_splits > 1.
// ABI: kernels/ABI.md. Defines: HK, KV_FP8, MT, WARPS, GROUPS, BN, STAGES, QSMEM (common/mla_core.cuh).
#include "common/mla_core.cuh"
#include "common/page64_merge.cuh"
#include "common/pdl.cuh"

using namespace mla;

// grid (HK/16, n_splits, B), block 32*WARPS. Split s of a length-len sequence
// covers [s*chunk, min((s+1)*chunk, len)), chunk = ceil(ceil(len/64)/n)*64.
extern "C" __global__ void __launch_bounds__(mla::THREADS, 1)
    page64_fwd(const unsigned char* __restrict__ q, const unsigned char* __restrict__ kv,
               const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
               const int* __restrict__ kv_last_page_len, const int* __restrict__ qo_indptr, float q_scale,
               float kv_scale, float sm_scale, int n_splits, __nv_bfloat16* __restrict__ o,
               float* __restrict__ lse, float* __restrict__ part_o, float* __restrict__ part_lse) {
  extern __shared__ __align__(128) unsigned char smem[];
  check_smem();
  pdl_launch_dependents();
  const float scale_log2 = sm_scale * q_scale * kv_scale * LOG2E;
  const float out_scale = kv_scale;
  const int hg = blockIdx.x, s = blockIdx.y, b = blockIdx.z;
  const int p0 = kv_indptr[b], np = kv_indptr[b + 1] - p0;
  const int len = np > 0 ? (np - 1) * 64 + kv_last_page_len[b] : 0;
  const int chunk = ((np + n_splits - 1) / n_splits) * 64;
  const int t0 = min(s * chunk, len), t1 = min(t0 + chunk, len);
  const int qo0 = qo_indptr[b], s_q = qo_indptr[b + 1] - qo0;
  const bool to_part = n_splits > 1;
  for (int i0 = 0; i0 < s_q; i0 += MT) {
    Pass ps;
    int t_end = t0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int ii = i0 + mt;
      ps.valid[mt] = ii < s_q;
      ps.lim[mt] = ps.valid[mt] ? min(max(len - s_q + ii + 1, 0), t1) : 0;
      const long long row = qo0 + min(ii, s_q - 1);
      ps.q_row[mt] = row * HK + hg * 16;
      ps.o_row[mt] = (to_part ? row * n_splits + s : row) * HK + hg * 16;
      t_end = max(t_end, ps.lim[mt]);
    }
    ps.t0 = t0;
    ps.t1 = t_end;
    attend<64>(smem, ps, q, kv, kv_indices + p0, scale_log2, out_scale, to_part, o, part_o,
               to_part ? part_lse : lse);
  }
}
