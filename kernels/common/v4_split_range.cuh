// The split rule both v4_split kernels (v4_split.cu, v4_split_wg.cu) read
// from the caller's plan (SPEC section 2): split s of row i covers the
// row's tokens [ceil(len*s/n), ceil(len*(s+1)/n)), n = split_indptr[i+1] -
// split_indptr[i], and writes slot split_indptr[i] + s.
#pragma once

namespace v4split {

struct Range {
  int slot0, s;    // the row's first partial slot, and this split
  int beg;         // the row's first kv_indices entry
  long long a, b;  // tokens [a, b) of the row's list (a >= b: empty)
  __device__ long long slot() const { return static_cast<long long>(slot0) + s; }
};

// False where the CTA has nothing to do: a row past `rows`, or s >= n.
__device__ __forceinline__ bool split_range(const int* __restrict__ split_indptr, const int* __restrict__ kv_indptr,
                                            int row, int s, int rows, Range& r) {
  if (row >= rows) return false;
  r.slot0 = split_indptr[row];
  r.s = s;
  const int n = split_indptr[row + 1] - r.slot0;
  if (s >= n) return false;
  r.beg = kv_indptr[row];
  const long long len = kv_indptr[row + 1] - r.beg;
  r.a = (len * s + n - 1) / n;
  r.b = (len * (s + 1) + n - 1) / n;
  return true;
}

// Longest pieces first. Blocks start in linear order, one wgmma CTA per
// SM, so a launch of several waves in row order ends with the long rows'
// pieces alone on a few SMs (v4_split at 64 heads, 256 rows of 8k-16k
// tokens in two splits: 17% of the SM time idle). Ranking the rows by their
// pieces' length and handing the L-th CTA (over y, z) the L-th longest
// row's pieces makes the hardware's dispatch a longest-first list schedule.
// The host asks for it (`longest_first`) only where that can pay
// (`SplitPlan::piece_order`): ranking costs short launches more than it
// saves, and even a vote on whether to rank cost SWA's 18 us launches
// 4.6-7.8% (H100). The
// lengths still come from device memory, so any lengths give the same
// outputs. Each thread ranks its rows against all of them (O(rows^2 /
// threads)), so at most LPT_MAX_ROWS rows; more keep the grid's order.
// Uses 4 KB of `scratch` (shared memory, free until the caller's setup).
constexpr int LPT_ROW_BITS = 9;
constexpr int LPT_MAX_ROWS = 1 << LPT_ROW_BITS;

__device__ __forceinline__ void lpt_piece(const int* __restrict__ split_indptr, const int* __restrict__ kv_indptr,
                                          int rows, int longest_first, int* scratch, int& row, int& s) {
  const int ny = gridDim.y, nz = gridDim.z;
  row = blockIdx.y;
  s = blockIdx.z;
  if (!longest_first || rows > LPT_MAX_ROWS) return;
  const int lin = blockIdx.z * ny + blockIdx.y;
  s = lin % nz;
  row = lin / nz;  // rows past `rows` keep their place at the end
  if (row >= rows) return;
  // Key: the row's longest piece (capped to fit) above LPT_ROW_BITS of
  // LPT_MAX_ROWS - 1 - row, so keys are distinct and positive, and equal
  // pieces keep row order; -1 pads the scan to whole int4s.
  const int r4 = (rows + 3) & ~3;
  for (int j = threadIdx.x; j < r4; j += blockDim.x) {
    int key = -1;
    if (j < rows) {
      const int len = kv_indptr[j + 1] - kv_indptr[j];
      const int n = split_indptr ? split_indptr[j + 1] - split_indptr[j] : 1;
      const int piece = min(n > 0 ? (len + n - 1) / n : 0, (1 << (31 - LPT_ROW_BITS)) - 1);
      key = (piece << LPT_ROW_BITS) | (LPT_MAX_ROWS - 1 - j);
    }
    scratch[j] = key;
  }
  __syncthreads();
  const int target = row;
  for (int j = threadIdx.x; j < rows; j += blockDim.x) {
    const int kj = scratch[j];
    int rank = 0;
    for (int k = 0; k < r4; k += 4) {
      const int4 kk = *reinterpret_cast<const int4*>(scratch + k);
      rank += (kk.x > kj) + (kk.y > kj) + (kk.z > kj) + (kk.w > kj);
    }
    if (rank == target) scratch[LPT_MAX_ROWS] = j;
  }
  __syncthreads();
  row = scratch[LPT_MAX_ROWS];
  __syncthreads();  // the caller's setup may reuse the scratch
}

// A row with no tokens in a one-split plan (v4_split_one on either core):
// only the sink's key, so o = 0 and lse = sink (-inf without one) for heads
// h0 .. h0+HEADS-1, whose outputs start at (row, head) index out0. A macro:
// as an inlined function it put 4 of the wgmma entry's registers on the
// stack (nvdisasm), and the mma entry compiles the same either way.
#define V4_SPLIT_EMPTY_ROW(HEADS, THREADS, sink, h0, out0, o, lse)                                            \
  do {                                                                                                        \
    if (threadIdx.x < (HEADS))                                                                                \
      (lse)[(out0) + threadIdx.x] = (sink) ? (sink)[(h0) + threadIdx.x] : -__int_as_float(0x7f800000);        \
    uint4* z_ = reinterpret_cast<uint4*>((o) + (out0) * 512);                                                 \
    for (int k_ = threadIdx.x; k_ < (HEADS) * 512 / 8; k_ += (THREADS)) z_[k_] = make_uint4(0u, 0u, 0u, 0u);  \
  } while (0)

}  // namespace v4split
