#include "model/matmul_kernels.h"

#include <atomic>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ANCHORKV_X86_KERNELS 1
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif
#if defined(__aarch64__) && defined(__linux__) && defined(__GNUC__)
#define ANCHORKV_ARM_KERNELS 1
#include <sys/auxv.h>
#endif

namespace anchorkv::model {
namespace {

#if ANCHORKV_X86_KERNELS
bool has_avx512bw() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"); }
bool has_avx512vnni() {
  return has_avx512bw() && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

// AMX-INT8 and the tile registers: Linux hands out their state on request only.
bool amx_granted() {
#if defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool tile = (d >> 24) & 1u, int8 = (d >> 25) & 1u;
  if (!tile || !int8 || !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) return false;
  constexpr long kRequestPermission = 0x1023, kTileData = 18;
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
#else
  return false;
#endif
}
#endif

#if ANCHORKV_ARM_KERNELS
// The kernel's word on the CPU's features (Linux's HWCAP bits; the
// instructions need no permission).
constexpr unsigned long kHwcapAsimdDp = 1ul << 20, kHwcap2I8mm = 1ul << 13;
bool has_dotprod() { return (getauxval(AT_HWCAP) & kHwcapAsimdDp) != 0; }
bool has_i8mm() { return has_dotprod() && (getauxval(AT_HWCAP2) & kHwcap2I8mm) != 0; }
#endif

unsigned pack(MatmulKernels k) {
  return (k.byte_rows ? 1u : 0u) | (k.vnni_rows ? 2u : 0u) | (k.amx ? 4u : 0u) | (k.dot_rows ? 8u : 0u) |
         (k.mmla_rows ? 16u : 0u);
}
MatmulKernels unpack(unsigned bits) {
  return {(bits & 1u) != 0, (bits & 2u) != 0, (bits & 4u) != 0, (bits & 8u) != 0, (bits & 16u) != 0};
}

std::atomic<unsigned>& in_use() {
  static std::atomic<unsigned> bits{pack(cpu_matmul_kernels())};
  return bits;
}

}  // namespace

MatmulKernels cpu_matmul_kernels() {
  static const MatmulKernels cpu = [] {
    MatmulKernels k;
#if ANCHORKV_X86_KERNELS
    k.byte_rows = has_avx512bw();
    k.vnni_rows = has_avx512vnni();
    k.amx = amx_granted();
#endif
#if ANCHORKV_ARM_KERNELS
    k.dot_rows = has_dotprod();
    k.mmla_rows = has_i8mm();
#endif
    return k;
  }();
  return cpu;
}

MatmulKernels matmul_kernels() { return unpack(in_use().load(std::memory_order_relaxed)); }

MatmulKernels use_matmul_kernels(MatmulKernels k) {
  return unpack(in_use().exchange(pack(k) & pack(cpu_matmul_kernels()), std::memory_order_relaxed));
}

}  // namespace anchorkv::model
