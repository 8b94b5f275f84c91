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

}  // namespace v4split
