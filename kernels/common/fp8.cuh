// e4m3 -> f16 conversion of V for the P V mma. Every e4m3 value is an exact
// f16, so the a8w8 kernels run f16 mma on V with no rounding (Q.K runs on
// e4m3 directly, by wgmma).
//
// FP8_CVT picks the method (both exact for finite inputs):
//   0: hardware cvt.rn.f16x2.e4m3x2 (keeps NaN as NaN; measured faster);
//   1: bit reinterpretation: the e4m3 bits placed in an f16 with the exponent
//      bias left at 7 give value * 2^-8, undone by V_F16_SCALE; maps NaN
//      bytes to finite values.
#pragma once

#ifndef FP8_CVT
#define FP8_CVT 0
#endif
static_assert(FP8_CVT == 0 || FP8_CVT == 1, "FP8_CVT must be 0 or 1");

namespace mla {

__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short x) {
  unsigned r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(x));
  return r;
}

// Bytes 1 and 3 of t -> f16x2 holding value * 2^-8 (byte 1 in the low half).
__device__ __forceinline__ unsigned e4m3_odd_bytes_scaled(unsigned t) {
  return (t & 0x80008000u) | ((t >> 1) & 0x3F803F80u);
}

// V operand after ldmatrix.trans: x = (byte 0, byte 2), y = (byte 1, byte 3),
// i.e. two tokens of one dimension per register.
__device__ __forceinline__ void v_cvt(unsigned w, unsigned& x, unsigned& y) {
#if FP8_CVT == 1
  x = e4m3_odd_bytes_scaled(w << 8);
  y = e4m3_odd_bytes_scaled(w);
#else
  const unsigned t = __byte_perm(w, 0u, 0x3120u);
  x = e4m3x2_to_f16x2(static_cast<unsigned short>(t & 0xFFFFu));
  y = e4m3x2_to_f16x2(static_cast<unsigned short>(t >> 16));
#endif
}

constexpr float V_F16_SCALE = FP8_CVT == 1 ? 256.f : 1.f;

}  // namespace mla
