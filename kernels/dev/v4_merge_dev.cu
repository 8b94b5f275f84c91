// Dev-only stand-in for split_merge (merge.cu, owned by the MLA kernel author),
// with the signature the brief fixes; used by v4_check.py until merge.cu lands.
#include <cuda_bf16.h>

// grid (rows), block 256. H <= 128.
extern "C" __global__ void __launch_bounds__(256)
    split_merge(const float* part_o, const float* part_lse, const int* split_indptr,
                const float* sink, int rows, int H, __nv_bfloat16* o, float* lse) {
  __shared__ float gsh[128];
  const int r = blockIdx.x;
  if (r >= rows) return;
  const int s0 = split_indptr[r], s1 = split_indptr[r + 1];
  const float ninf = __int_as_float(0xff800000u);
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    const float sk = sink ? sink[h] : ninf;
    float m = sk;
    for (int s = s0; s < s1; ++s) m = fmaxf(m, part_lse[(size_t)s * H + h]);
    float g = ninf;
    if (m != ninf) {
      float sum = sink ? expf(sk - m) : 0.f;
      for (int s = s0; s < s1; ++s) sum += expf(part_lse[(size_t)s * H + h] - m);
      g = m + logf(sum);
    }
    gsh[h] = g;
    lse[(size_t)r * H + h] = g;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < H * 128; c += blockDim.x) {
    const int h = c >> 7, d4 = c & 127;
    const float g = gsh[h];
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = s0; s < s1; ++s) {
      const float l = part_lse[(size_t)s * H + h];
      const float w = (g == ninf || l == ninf) ? 0.f : expf(l - g);
      if (w == 0.f) continue;
      const float4 v = reinterpret_cast<const float4*>(part_o + ((size_t)s * H + h) * 512)[d4];
      acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    }
    __nv_bfloat162 a = __floats2bfloat162_rn(acc.x, acc.y), b = __floats2bfloat162_rn(acc.z, acc.w);
    __nv_bfloat162* op = reinterpret_cast<__nv_bfloat162*>(o + ((size_t)r * H + h) * 512 + d4 * 4);
    op[0] = a;
    op[1] = b;
  }
}
