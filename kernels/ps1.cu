// ps1: persistent MLA decode, page size 1, causal mask on global (DCP
// round-robin) positions, host-built work list; f32 partials + reduce.
// ABI: kernels/ABI.md. Defines: HK, KV_FP8, MT, WARPS, GROUPS, BN, STAGES, QSMEM, LD_LINES, EARLY_Q (common/mla_core.cuh).
#include "common/mla_core.cuh"
#include "common/pdl.cuh"
#include "common/ps1_reduce.cuh"

using namespace mla;

// CTA c runs work items [work_indptr[c], work_indptr[c+1]) in order; an item
// is 8 ints (seq, partial, q_start, q_end, kv_start, kv_end, 0, 0).
extern "C" __global__ void __launch_bounds__(mla::THREADS, 1)
    ps1_fwd(const unsigned char* __restrict__ q, const unsigned char* __restrict__ kv,
            const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
            const int* __restrict__ qo_indptr, const int* __restrict__ g_kv_indptr,
            const int* __restrict__ work_indptr, const int* __restrict__ work_items, float q_scale,
            float kv_scale, float sm_scale, int W, int rank, int S, __nv_bfloat16* __restrict__ o,
            float* __restrict__ lse, float* __restrict__ part_o, float* __restrict__ part_lse) {
  extern __shared__ __align__(128) unsigned char smem[];
  check_smem();
  pdl_launch_dependents();
  const float scale_log2 = sm_scale * q_scale * kv_scale * LOG2E;
  const float out_scale = kv_scale;
  // Item blockIdx.x is read with work_indptr, not after it: the balanced
  // plan gives CTA c item c first whenever it has at least as many items as
  // busy CTAs, so one dependent round trip leaves the CTA's start. The host
  // pads work_items to num_ctas items, so this read is always in bounds.
  const int4* spec = reinterpret_cast<const int4*>(work_items) + 2ll * blockIdx.x;
  const int4 s0 = __ldg(spec), s1 = __ldg(spec + 1);
  const int w_begin = work_indptr[blockIdx.x], w_end = work_indptr[blockIdx.x + 1];
  for (int w = w_begin; w < w_end; ++w) {
    int4 i0 = s0, i1 = s1;
    if (w != static_cast<int>(blockIdx.x)) {
      const int4* it = reinterpret_cast<const int4*>(work_items) + 2ll * w;
      i0 = __ldg(it);
      i1 = __ldg(it + 1);
    }
    const int b = i0.x, partial = i0.y, q_start = i0.z, q_end = i0.w, kv_start = i1.x, kv_end = i1.y;
    const int qo0 = qo_indptr[b], s_q = qo_indptr[b + 1] - qo0;
    const int L = g_kv_indptr[b + 1] - g_kv_indptr[b];
    const int rows = (q_end - q_start) * HK;
    const bool to_part = partial >= 0;
    const long long out0 = static_cast<long long>(to_part ? partial : q_start) * HK;
    for (int rb = 0; rb < rows; rb += 16 * MT) {
      Pass ps;
      int t1 = kv_start;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r0 = rb + mt * 16;
        ps.valid[mt] = r0 < rows;
        const int ii = q_start - qo0 + r0 / HK;  // query position within the sequence
        const int vis = dcp_local_len(rank, L - s_q + ii + 1, W, S);
        ps.lim[mt] = ps.valid[mt] ? min(kv_end, vis) : 0;
        ps.q_row[mt] = static_cast<long long>(q_start) * HK + r0;
        ps.o_row[mt] = out0 + r0;
        t1 = max(t1, ps.lim[mt]);
      }
      ps.t0 = kv_start;
      ps.t1 = t1;
      attend<1>(smem, ps, q, kv, kv_indices + kv_indptr[b], scale_log2, out_scale, to_part, o, part_o,
                to_part ? part_lse : lse);
    }
  }
}
