// What both MLA decode cores (mla_core.cuh, mla_wg.cuh) and their second
// kernels share: the head dims, log constants, -inf and the DCP shard length.
#pragma once

namespace mla {

constexpr int D_QK = 576;
constexpr int D_V = 512;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

__device__ __forceinline__ float ninf() { return -__int_as_float(0x7f800000); }

// Tokens of a rank's shard of a length-L sequence (SPEC section 1).
__device__ __forceinline__ int dcp_local_len(int r, int L, int W, int S) {
  if (L <= 0) return 0;
  const int ws = W * S;
  const int rem = L % ws - r * S;
  return (L / ws) * S + min(max(rem, 0), S);
}

}  // namespace mla
