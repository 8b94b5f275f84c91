// DeepSeek-V4 HCA decode with an in-kernel split and merge (SPEC section 2,
// variant hca_persist). Every call plans from the real lengths on the GPU: the
// flattened token range of rows 0..N is cut into P equal partitions; a row
// inside one partition is finished directly (with the sink); a row cut by
// partition boundaries leaves f32 pieces in o_acc/lse_acc slot 2p (first row of
// partition p) or 2p+1 (its last row), and the CTA that brings counters[row] to
// pieces * head_groups merges them and resets the counter to 0. Nobody waits
// on anybody, so any CTA scheduling order is safe.
#include "v4_core.cuh"

namespace {

// Largest r in [0, n) with indptr[r] - base <= x (x < total): a 256-ary search,
// two rounds for n <= 65536.
__device__ int find_row(const int* indptr, int n, long long base, long long x) {
  int lo = 0, hi = n;
  while (hi - lo > 1) {
    const int step = (hi - lo + v4::THREADS - 1) / v4::THREADS;
    const int r = lo + static_cast<int>(threadIdx.x) * step;
    const bool pred = r < hi && static_cast<long long>(indptr[r]) - base <= x;
    const int c = __syncthreads_count(pred);
    const int nlo = lo + (c - 1) * step;
    hi = min(nlo + step, hi);
    lo = nlo;
  }
  return lo;
}

// Partition p covers [bound(p), bound(p+1)).
__device__ __forceinline__ long long bound(long long p, long long total, int parts) {
  return p * total / parts;
}
// The partition holding flattened token x: the largest p with bound(p) <= x.
__device__ __forceinline__ int part_of(long long x, long long total, int parts) {
  return static_cast<int>(((x + 1) * parts - 1) / total);
}

// Pieces of a row [st, en) (en > st): the non-empty partitions it meets.
__device__ int row_pieces(long long st, long long en, long long total, int parts) {
  const int pf = part_of(st, total, parts), pl = part_of(en - 1, total, parts);
  if (total >= parts) return pl - pf + 1;  // no partition is empty
  int c = 0;
  for (int q = pf; q <= pl; ++q) c += bound(q + 1, total, parts) > bound(q, total, parts);
  return c;
}

// Merges every piece of row r over all HK heads and writes o, lse with the sink.
__device__ void merge_row(char* sm, int r, long long st, long long en, long long total, int parts,
                          const float* o_acc, const float* lse_acc, const float* sink,
                          __nv_bfloat16* o, float* lse) {
  using namespace v4;
  const int tid = threadIdx.x;
  const int pf = part_of(st, total, parts), pl = part_of(en - 1, total, parts);
  const int np = pl - pf + 1;
  int* slots = reinterpret_cast<int*>(sm + SM_XCH);  // -1: empty partition
  float* gsh = reinterpret_cast<float*>(sm + SM_MISC + 16);
  for (int k = tid; k < np; k += THREADS) {
    const int q = pf + k;
    const long long b0 = bound(q, total, parts), b1 = bound(q + 1, total, parts);
    slots[k] = b1 > b0 ? 2 * q + (b0 < st ? 1 : 0) : -1;
  }
  __syncthreads();
  for (int h = tid; h < HK; h += THREADS) {
    const float sk = sink ? sink[h] : V4_NEG_INF;
    float m = sk;
    for (int k = 0; k < np; ++k)
      if (slots[k] >= 0) m = fmaxf(m, __ldcg(lse_acc + (size_t)slots[k] * HK + h));
    float sum = 0.f;
    if (m != V4_NEG_INF) {
      sum = sink ? expf(sk - m) : 0.f;
      for (int k = 0; k < np; ++k)
        if (slots[k] >= 0) sum += expf(__ldcg(lse_acc + (size_t)slots[k] * HK + h) - m);
    }
    const float g = m == V4_NEG_INF ? V4_NEG_INF : m + logf(sum);
    gsh[h] = g;
    lse[(size_t)r * HK + h] = g;
  }
  __syncthreads();
  for (int c = tid; c < HK * (D / 4); c += THREADS) {
    const int h = c / (D / 4), d4 = c - h * (D / 4);
    const float g = gsh[h];
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < np; ++k) {
      const int sl = slots[k];
      if (sl < 0) continue;
      const float w = g == V4_NEG_INF ? 0.f : expf(__ldcg(lse_acc + (size_t)sl * HK + h) - g);
      const float4 v = __ldcg(reinterpret_cast<const float4*>(o_acc + ((size_t)sl * HK + h) * D) + d4);
      acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    }
    uint2 pk;
    pk.x = pack_bf16(acc.x, acc.y);
    pk.y = pack_bf16(acc.z, acc.w);
    *reinterpret_cast<uint2*>(o + ((size_t)r * HK + h) * D + d4 * 4) = pk;
  }
}

}  // namespace

// grid (HK/64, P), block 256, dynamic smem v4::SMEM_BYTES. parts (P) <= 4096.
// Head groups are the fastest grid index, so the CTAs of one partition run in
// the same wave and the second reads the partition's KV from L2.
// o_acc [2P, HK, 512] f32, lse_acc [2P, HK] f32, counters [>= n_rows] i32 zero
// at rest (the kernel leaves them zero). Rows of length 0 are not written.
extern "C" __global__ void __launch_bounds__(v4::THREADS, 1)
    hca_persist(const unsigned char* __restrict__ q_packed,
                const __nv_bfloat16* __restrict__ q_rope,
                const unsigned char* __restrict__ pool_packed,
                const __nv_bfloat16* __restrict__ pool_rope, const int* __restrict__ kv_indptr,
                const int* __restrict__ kv_indices, const float* __restrict__ sink,
                float sm_scale, int n_rows, int parts, float* o_acc, float* lse_acc,
                int* counters, __nv_bfloat16* o, float* lse) {
  using namespace v4;
  extern __shared__ __align__(16) char sm[];
  const int h0 = blockIdx.x * HG, p = blockIdx.y;
  if (n_rows <= 0 || p >= parts) return;
  const long long base = kv_indptr[0];
  const long long total = static_cast<long long>(kv_indptr[n_rows]) - base;
  if (total <= 0) return;
  const long long lo = bound(p, total, parts), hi = bound(p + 1, total, parts);
  if (lo >= hi) return;
  const Src src{q_packed, q_rope, pool_packed, pool_rope, kv_indices, sm_scale * LOG2E};
  int* flag = reinterpret_cast<int*>(sm + SM_MISC);

  for (int r = find_row(kv_indptr, n_rows, base, lo); r < n_rows; ++r) {
    const long long st = kv_indptr[r] - base, en = kv_indptr[r + 1] - base;
    if (st >= hi) break;
    if (en <= st) continue;
    const long long a = st > lo ? st : lo, b = en < hi ? en : hi;
    Acc acc;
    attend(sm, src, r, h0, base + a, static_cast<int>(b - a), acc);
    if (st >= lo && en <= hi) {
      store_final(sm, acc, o, lse, r, h0, sink);
      continue;
    }
    store_partial(sm, acc, o_acc, lse_acc, 2LL * p + (st > lo ? 1 : 0), h0);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const int need = row_pieces(st, en, total, parts) * static_cast<int>(gridDim.x);
      *flag = atomicAdd(counters + r, 1) == need - 1;
    }
    __syncthreads();
    if (*flag) {
      __threadfence();
      merge_row(sm, r, st, en, total, parts, o_acc, lse_acc, sink, o, lse);
      if (threadIdx.x == 0) counters[r] = 0;
    }
  }
}
