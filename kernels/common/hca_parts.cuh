// hca_persist's in-kernel partition plan (SPEC section 2), shared by both of
// its kernels (hca_persist.cu on the mma.sync core, hca_persist_wg.cu on the
// wgmma core) so they cut the work identically, as the host's
// hca_partition_plan emulates: the flattened token range of rows 0..N is
// cut into P equal partitions.
#pragma once

namespace hca {
namespace {  // internal linkage: inlined as the kernels' own helpers were

// Largest r in [0, n) with indptr[r] - base <= x (x < total): a NT-ary
// search over the block's NT threads, two rounds for n <= NT^2.
template <int NT>
__device__ int find_row(const int* indptr, int n, long long base, long long x) {
  int lo = 0, hi = n;
  while (hi - lo > 1) {
    const int step = (hi - lo + NT - 1) / NT;
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

// The workspace slot of a cut row's piece in partition q (q's start at
// b0): 2q for the row that starts before it, 2q + 1 for the one at its end.
__device__ __forceinline__ long long piece_slot(int q, long long b0, long long st) {
  return 2LL * q + (st > b0 ? 1 : 0);
}

// Minimum tokens per partition: below it a CTA's fixed cost (Q load,
// pipeline fill, partial write, merge) outweighs the parallelism it buys.
// The host's plan (hca_partition_plan) needs the same value, so the host
// passes it from its one constant.
#ifndef HCA_MIN_TOKENS
#error "the host sets HCA_MIN_TOKENS"
#endif
static_assert(HCA_MIN_TOKENS >= 1, "HCA_MIN_TOKENS must be positive");

// The partitions this call uses: P_eff = min(parts, SMs / head groups,
// ceil(total / HCA_MIN_TOKENS)), >= 1: at most one wave of one CTA per SM
// (head groups are gridDim.x). CTAs with p >= P_eff exit at once.
__device__ __forceinline__ int effective_parts(long long total, int parts) {
  unsigned nsm;
  asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
  long long pe = static_cast<long long>(nsm) / gridDim.x;
  const long long by_work = (total + HCA_MIN_TOKENS - 1) / HCA_MIN_TOKENS;
  if (by_work < pe) pe = by_work;
  if (parts < pe) pe = parts;
  return pe < 1 ? 1 : static_cast<int>(pe);
}

}  // namespace
}  // namespace hca
