// libFuzzer target for the GGUF reader: any bytes must give either a parsed
// file or an anchorkv::Error, never a crash or an out-of-bounds read.
#include <cstddef>
#include <cstdint>

#include "anchorkv/status.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = anchorkv::io::GgufFile::from_memory(data, size, "fuzz.gguf");
    for (const auto& t : f.tensors()) {
      // Touch the first and last byte of every tensor the reader accepted.
      volatile uint8_t first = t.data[0], last = t.data[t.n_bytes - 1];
      (void)first;
      (void)last;
    }
  } catch (const anchorkv::Error&) {
  }
  return 0;
}
