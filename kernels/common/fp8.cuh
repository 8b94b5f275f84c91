// e4m3 -> f16 conversion of V for the P V mma. Every e4m3 value is an exact
// f16, so the a8w8 kernels run f16 mma on V with no rounding (Q.K runs on
// e4m3 directly, by wgmma). The conversion is the hardware
// cvt.rn.f16x2.e4m3x2: it keeps NaN as NaN, and it measured faster than
// placing the e4m3 bits in an f16 by integer operations.
#pragma once

namespace mla {

__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short x) {
  unsigned r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(x));
  return r;
}

// V operand after ldmatrix.trans: x = (byte 0, byte 2), y = (byte 1, byte 3),
// i.e. two tokens of one dimension per register.
__device__ __forceinline__ void v_cvt(unsigned w, unsigned& x, unsigned& y) {
  const unsigned t = __byte_perm(w, 0u, 0x3120u);
  x = e4m3x2_to_f16x2(static_cast<unsigned short>(t & 0xFFFFu));
  y = e4m3x2_to_f16x2(static_cast<unsigned short>(t >> 16));
}

}  // namespace mla
