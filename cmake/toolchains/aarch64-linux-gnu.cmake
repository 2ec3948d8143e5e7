# Cross build for 64-bit ARM Linux with Debian's cross compiler and the arm64
# multiarch libraries (dpkg --add-architecture arm64; see scripts/test-aarch64).
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Headers and libraries of the target come from the multiarch folders; build
# programs (none today) from the host.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# Test programs run under user-mode emulation on an x86 host.
find_program(ANCHORKV_QEMU_AARCH64 qemu-aarch64)
if(ANCHORKV_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${ANCHORKV_QEMU_AARCH64})
endif()
