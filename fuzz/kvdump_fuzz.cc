// libFuzzer target for the .akv K/V dump reader.
#include <cstddef>
#include <cstdint>

#include "anchorkv/status.h"
#include "io/kvdump.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    anchorkv::io::parse_kvdump(data, size, "fuzz.akv");
  } catch (const anchorkv::Error&) {
  }
  return 0;
}
