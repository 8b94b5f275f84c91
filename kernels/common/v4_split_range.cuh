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
