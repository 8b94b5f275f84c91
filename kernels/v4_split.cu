// DeepSeek-V4 native-FP8 decode with a caller-built split plan (SPEC section 2,
// variant v4_split). Stage 1 of 2: every (row, split, head group) CTA writes an
// f32 partial without the sink; split_merge (merge.cu), a programmatic
// dependent (common/pdl.cuh), adds the sink once.
// The plan is read from device memory, so a captured graph replays correctly
// with new kv_indptr / kv_indices contents.
#include "v4_core.cuh"
#include "common/pdl.cuh"
#include "common/v4_split_range.cuh"

// grid (HK/64 or 1, rows, n_max), block 256, dynamic smem v4::SMEM_BYTES (head
// groups fastest, so both halves of a row's heads meet its KV in L2 together).
// The split rule: common/v4_split_range.cuh.
// An empty split (pad rows included) writes only its LSE (-inf), not its o.
extern "C" __global__ void __launch_bounds__(v4::THREADS, 1)
    v4_split(const unsigned char* __restrict__ q_packed, const __nv_bfloat16* __restrict__ q_rope,
             const unsigned char* __restrict__ pool_packed,
             const __nv_bfloat16* __restrict__ pool_rope, const int* __restrict__ kv_indptr,
             const int* __restrict__ kv_indices, const int* __restrict__ split_indptr,
             float sm_scale, int rows, float* __restrict__ part_o, float* __restrict__ part_lse) {
  extern __shared__ __align__(16) char sm[];
  mla::pdl_launch_dependents();  // split_merge may start; it waits for the partials
  const int h0 = blockIdx.x * v4::HG, row = blockIdx.y, s = blockIdx.z;
  v4split::Range sr;
  if (!v4split::split_range(split_indptr, kv_indptr, row, s, rows, sr)) return;
  if (sr.b <= sr.a) {
    // Pad rows (length 0) and empty splits: LSE -inf is all split_merge needs
    // (a part of LSE -inf has weight 0 and its o is never read), so skip the
    // Q load, the pipeline and the 128 KB partial write.
    if (threadIdx.x < v4::HG) part_lse[sr.slot() * v4::HK + h0 + threadIdx.x] = V4_NEG_INF;
    return;
  }
  const v4::Src src{q_packed, q_rope, pool_packed, pool_rope, kv_indices, sm_scale * v4::LOG2E};
  v4::Acc acc;
  v4::attend(sm, src, row, h0, sr.beg + sr.a, static_cast<int>(sr.b - sr.a), acc);
  v4::store_partial(sm, acc, part_o, part_lse, sr.slot(), h0);
}

// v4_split for a plan of one split in every row (the host's pick), as
// v4_split_wg.cu's: the CTA's range is its whole row, so it adds the sink
// and writes bf16 o and lse itself, and no split_merge follows. A row of
// length 0 (pad rows) gets split_merge's result: o = 0, lse = the sink.
// grid (HK/64 or 1, rows), block 256; arguments as v4_split_wg.cu's.
extern "C" __global__ void __launch_bounds__(v4::THREADS, 1)
    v4_split_one(const unsigned char* __restrict__ q_packed, const __nv_bfloat16* __restrict__ q_rope,
                 const unsigned char* __restrict__ pool_packed,
                 const __nv_bfloat16* __restrict__ pool_rope, const int* __restrict__ kv_indptr,
                 const int* __restrict__ kv_indices, const float* __restrict__ sink, float sm_scale,
                 int rows, __nv_bfloat16* __restrict__ o, float* __restrict__ lse) {
  extern __shared__ __align__(16) char sm[];
  const int h0 = blockIdx.x * v4::HG, row = blockIdx.y;
  if (row >= rows) return;
  const int beg = kv_indptr[row], len = kv_indptr[row + 1] - beg;
  if (len <= 0) {
    const long long out0 = static_cast<long long>(row) * v4::HK + h0;
    V4_SPLIT_EMPTY_ROW(v4::HG, v4::THREADS, sink, h0, out0, o, lse);
    return;
  }
  const v4::Src src{q_packed, q_rope, pool_packed, pool_rope, kv_indices, sm_scale * v4::LOG2E};
  v4::Acc acc;
  v4::attend(sm, src, row, h0, beg, len, acc);
  v4::store_final(sm, acc, o, lse, row, h0, sink);
}
