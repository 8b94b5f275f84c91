// e4m3 -> f16 conversion of V for the P V mma. Every e4m3 value is an exact
// f16, so the a8w8 kernels run f16 mma on V with no rounding (Q.K runs on
// e4m3 directly, by wgmma). The conversion is the hardware
// cvt.rn.f16x2.e4m3x2: it keeps NaN as NaN, and it measured faster than
// placing the e4m3 bits in an f16 by integer operations.
#pragma once

namespace mla {

// Four e4m3 of w (low byte first) as two f16x2. Splitting w by mov.b32
// lets ptxas convert the upper pair in place (F2FP ... R.H1), where the
// upper half cast to a short costs a shift first.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(unsigned w, unsigned& lo, unsigned& hi) {
  asm("{\n"
      " .reg .b16 a, b;\n"
      " mov.b32 {a, b}, %2;\n"
      " cvt.rn.f16x2.e4m3x2 %0, a;\n"
      " cvt.rn.f16x2.e4m3x2 %1, b;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// V operand after ldmatrix.trans: x = (byte 0, byte 2), y = (byte 1, byte 3),
// i.e. two tokens of one dimension per register.
__device__ __forceinline__ void v_cvt(unsigned w, unsigned& x, unsigned& y) {
  e4m3x4_to_f16x2x2(__byte_perm(w, 0u, 0x3120u), x, y);
}

}  // namespace mla
