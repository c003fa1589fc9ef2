// shoal: a check of the CPU product's aarch64 paths (NEON for 4-bit decode rows), built with a
// cross compiler and run under qemu-aarch64 by `native/kernels/tests/aarch64_under_qemu.rs`:
// no aarch64 machine is at hand, and the product's tests in `inference` run on the host's
// instruction set only. 4-bit weights in MLX's packing, groups of 32/64/128, 1 to 9 rows,
// f32 and f16 scales; each output against an f64 reference and against the plain C++ path.
// Prints one line and exits 0 when every output is within 1e-5 of the sum of its terms'
// magnitudes.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../affine_kernels.h"
#include "mlx/types/half_types.h"

using namespace shoal;

int main() {
  uint64_t state = 88172645463325252ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  auto uniform = [&] { return static_cast<float>(next() >> 40) / (1 << 24) * 2.0f - 1.0f; };
  double worst = 0, worst_vs_plain = 0;
  int cases = 0;
  for (int group : {32, 64, 128}) {
    for (int k : {128, 256, 512}) {
      for (int m : {1, 2, 3, 5, 9}) {
        for (bool half : {false, true}) {
          const int n = 37, groups = k / group;
          std::vector<uint32_t> w(n * k / 8);
          std::vector<uint8_t> q(n * k);
          for (int r = 0; r < n; ++r) {
            for (int c = 0; c < k; ++c) {
              q[r * k + c] = next() % 16;
              w[(r * k + c) / 8] |= static_cast<uint32_t>(q[r * k + c]) << (4 * (c % 8));
            }
          }
          std::vector<float> scales(n * groups), biases(n * groups);
          std::vector<mlx::core::float16_t> scales16(n * groups), biases16(n * groups);
          for (int i = 0; i < n * groups; ++i) {
            scales16[i] = 0.01f + 0.02f * std::fabs(uniform());
            biases16[i] = 0.1f * uniform();
            scales[i] = static_cast<float>(scales16[i]);
            biases[i] = static_cast<float>(biases16[i]);
          }
          std::vector<float> x(m * k), out(m * n), plain(m * n);
          for (float& v : x) {
            v = uniform();
          }
          Problem p;
          p.x = x.data();
          p.w = w.data();
          p.w_row = k / 8;
          p.sb_row = groups;
          p.scales = half ? static_cast<const void*>(scales16.data()) : scales.data();
          p.biases = half ? static_cast<const void*>(biases16.data()) : biases.data();
          p.sb_type = half ? mlx::core::float16 : mlx::core::float32;
          p.n = n;
          p.k = k;
          p.group = group;
          p.bits = 4;
          for (int i = 0; i < m; ++i) {
            p.rows.push_back(static_cast<int64_t>(i) * k);
            p.out_rows.push_back(i);
          }
          p.out = out.data();
          run(p, Isa::Exact);
          p.out = plain.data();
          run(p, Isa::Scalar);
          for (int i = 0; i < m; ++i) {
            for (int r = 0; r < n; ++r) {
              double want = 0, size = 0;
              for (int c = 0; c < k; ++c) {
                const int g = r * groups + c / group;
                const double term = (static_cast<double>(scales[g]) * q[r * k + c] + biases[g]) *
                    x[i * k + c];
                want += term;
                size += std::fabs(term);
              }
              size = std::fmax(size, 1.0);
              worst = std::fmax(worst, std::fabs(out[i * n + r] - want) / size);
              worst_vs_plain =
                  std::fmax(worst_vs_plain, std::fabs(out[i * n + r] - plain[i * n + r]) / size);
            }
          }
          ++cases;
        }
      }
    }
  }
  std::printf("aarch64 product: %d cases, worst %.3g against f64, %.3g against the plain path\n",
              cases, worst, worst_vs_plain);
  return worst < 1e-5 && worst_vs_plain < 1e-5 ? 0 : 1;
}
