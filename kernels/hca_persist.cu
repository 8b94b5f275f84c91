// DeepSeek-V4 HCA decode with an in-kernel split and merge (SPEC section 2,
// variant hca_persist). Every call plans from the real lengths on the GPU: the
// flattened token range of rows 0..N is cut into P equal partitions; a row
// inside one partition is finished directly (with the sink); a row cut by
// partition boundaries leaves f32 pieces in o_acc/lse_acc slot 2p (first row of
// partition p) or 2p+1 (its last row). Each head group counts its pieces in
// its own 16-bit field of counters[row]; the CTA that brings its field to
// `pieces` merges that group's heads (its own piece straight from registers)
// and subtracts the field back to 0. Nobody waits on anybody, so any CTA
// scheduling order is safe. P here is the effective count (effective_parts):
// at most one wave of CTAs and at least HCA_MIN_TOKENS tokens per partition.
#include "common/hca_parts.cuh"
#include "v4_core.cuh"

using hca::bound;
using hca::part_of;

namespace {

// The last finisher of (row r, this head group) merges in registers: its own
// piece is still in `acc` (unnormalized, m and l in SM_ML), the other pieces
// are read from o_acc / lse_acc at exactly the places this thread would have
// written them, so every load is independent and unrolled (no serial
// round trips per element). Writes o and lse of this group's heads with the sink.
__device__ __forceinline__ void merge_regs(char* sm, v4::Acc& acc, int r, int h0, int p_self, long long st,
                           long long en, long long total, int parts, const float* o_acc,
                           const float* lse_acc, const float* sink, __nv_bfloat16* o, float* lse) {
  using namespace v4;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hw = warp / NSL, sl = warp - hw * NSL;
  const int g = lane >> 2, t4 = lane & 3;
  const int pf = part_of(st, total, parts), pl = part_of(en - 1, total, parts);
  const int np = pl - pf + 1;
  int* slots = reinterpret_cast<int*>(sm + SM_XCH);  // -1: empty partition or this one
  for (int k = tid; k < np; k += THREADS) {
    const int q = pf + k;
    const long long b0 = bound(q, total, parts), b1 = bound(q + 1, total, parts);
    slots[k] = (b1 > b0 && q != p_self) ? hca::piece_slot(q, b0, st) : -1;
  }
  __syncthreads();
  const float* ml = reinterpret_cast<const float*>(sm + SM_ML);
  float mx[MT][2], den[MT][2], own[MT][2], sk[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int hr = hw * MH + mt * 16 + g + 8 * rr;
      const float m = ml[2 * hr], l = ml[2 * hr + 1];
      own[mt][rr] = l > 0.f ? m + log2f(l) : V4_NEG_INF;  // log2 domain
      sk[mt][rr] = sink ? sink[h0 + hr] * LOG2E : V4_NEG_INF;
      mx[mt][rr] = fmaxf(own[mt][rr], sk[mt][rr]);
    }
  for (int k = 0; k < np; ++k) {
    const int slot = slots[k];
    if (slot < 0) continue;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int head = h0 + hw * MH + mt * 16 + g + 8 * rr;
        mx[mt][rr] = fmaxf(mx[mt][rr], __ldcg(lse_acc + (size_t)slot * HK + head) * LOG2E);
      }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const float M = mx[mt][rr];
      den[mt][rr] = M == V4_NEG_INF ? 0.f : exp2f(own[mt][rr] - M) + exp2f(sk[mt][rr] - M);
    }
  for (int k = 0; k < np; ++k) {
    const int slot = slots[k];
    if (slot < 0) continue;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int head = h0 + hw * MH + mt * 16 + g + 8 * rr;
        const float M = mx[mt][rr];
        if (M != V4_NEG_INF) den[mt][rr] += exp2f(__ldcg(lse_acc + (size_t)slot * HK + head) * LOG2E - M);
      }
  }
  // Own piece: acc / l * 2^(own - M) / den = acc * 2^(m - M) / den.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int hr = hw * MH + mt * 16 + g + 8 * rr;
      const float M = mx[mt][rr];
      const float f = M == V4_NEG_INF ? 0.f : exp2f(ml[2 * hr] - M) / den[mt][rr];
#pragma unroll
      for (int j = 0; j < DS / 8; ++j) {
        acc.o[mt][j][2 * rr] *= f;
        acc.o[mt][j][2 * rr + 1] *= f;
      }
    }
  for (int k = 0; k < np; ++k) {
    const int slot = slots[k];
    if (slot < 0) continue;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int head = h0 + hw * MH + mt * 16 + g + 8 * rr;
        const float M = mx[mt][rr];
        const float w = M == V4_NEG_INF
                            ? 0.f
                            : exp2f(__ldcg(lse_acc + (size_t)slot * HK + head) * LOG2E - M) / den[mt][rr];
        const float* op = o_acc + ((size_t)slot * HK + head) * D + sl * DS + 2 * t4;
#pragma unroll
        for (int j0 = 0; j0 < DS / 8; j0 += 8) {
          float2 v[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] = __ldcg(reinterpret_cast<const float2*>(op + (j0 + j) * 8));
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            acc.o[mt][j0 + j][2 * rr] += w * v[j].x;
            acc.o[mt][j0 + j][2 * rr + 1] += w * v[j].y;
          }
        }
      }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int head = h0 + hw * MH + mt * 16 + g + 8 * rr;
      const float M = mx[mt][rr];
      unsigned* op = reinterpret_cast<unsigned*>(o + ((size_t)r * HK + head) * D + sl * DS + 2 * t4);
#pragma unroll
      for (int j = 0; j < DS / 8; ++j) op[j * 4] = pack_bf16(acc.o[mt][j][2 * rr], acc.o[mt][j][2 * rr + 1]);
      if (sl == 0 && t4 == 0) lse[(size_t)r * HK + head] = M == V4_NEG_INF ? V4_NEG_INF : (M + log2f(den[mt][rr])) * LN2;
    }
}

}  // namespace

// grid (HK/64, P), block 256, dynamic smem v4::SMEM_BYTES. parts (P) <= 4096;
// the call uses P_eff <= P partitions (effective_parts) and the rest exit.
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
  const int pe = hca::effective_parts(total, parts);
  if (p >= pe) return;
  const long long lo = bound(p, total, pe), hi = bound(p + 1, total, pe);
  if (lo >= hi) return;
  const Src src{q_packed, q_rope, pool_packed, pool_rope, kv_indices, sm_scale * LOG2E};
  int* flag = reinterpret_cast<int*>(sm + SM_MISC);
  // This head group's field of the row counter (bits 16g..16g+15).
  const int shift = 16 * static_cast<int>(blockIdx.x);

  for (int r = hca::find_row<THREADS>(kv_indptr, n_rows, base, lo); r < n_rows; ++r) {
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
    store_partial(sm, acc, o_acc, lse_acc, hca::piece_slot(p, lo, st), h0);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const int pieces = hca::row_pieces(st, en, total, pe);
      const int old = atomicAdd(counters + r, 1 << shift);
      const bool last = ((old >> shift) & 0xffff) == pieces - 1;
      // Every piece of this group has arrived: take the group's share back
      // out now (atomically: the other group may still be counting).
      if (last) atomicSub(counters + r, pieces << shift);
      *flag = last;
    }
    __syncthreads();
    if (*flag) {
      __threadfence();
      merge_regs(sm, acc, r, h0, p, st, en, total, pe, o_acc, lse_acc, sink, o, lse);
    }
  }
}
