// Which integer matmul kernels this process runs, decided in one place: what
// the CPU can run, less what the user (--no-amx) or a test switched off.
// Every kernel computes the same integer sums as the 16-bit row kernels and
// the scalar twin (tests compare them), so the choice moves speed, not bits
// beyond float rounding of the scales. A matmul reads the choice once per
// call and hands it to the kernels it runs.
#pragma once

namespace anchorkv::model {

struct MatmulKernels {
  bool byte_rows = false;  // Q4_K and Q6_K rows as unsigned bytes times int8 activations (AVX-512BW)
  bool vnni_rows = false;  // Q8_0 and Q4_0 rows four at a time in 32-bit dot products (AVX-512 VNNI)
  bool amx = false;        // prefill of kAmxMinTokens tokens or more on AMX tiles (AMX-INT8, Linux grants it)
  bool dot_rows = false;   // Q8_0, Q4_0 and Q4_K rows with the AArch64 dot-product instruction (SDOT)
  bool mmla_rows = false;  // Q8_0 and Q4_0 tiles of two rows and two tokens (AArch64 SMMLA, FEAT_I8MM)
};

// What this CPU and build can run (asked once).
MatmulKernels cpu_matmul_kernels();
// The kernels in use: cpu_matmul_kernels() until use_matmul_kernels changes it.
MatmulKernels matmul_kernels();
// Use `k` from now on, limited to what cpu_matmul_kernels() allows; returns
// the kernels in use before.
MatmulKernels use_matmul_kernels(MatmulKernels k);

}  // namespace anchorkv::model
