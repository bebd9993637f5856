# Cross-compiling for 64-bit ARM Linux with Debian's cross toolchain (gcc-aarch64-linux-gnu) and
# the arm64 libraries installed through multiarch (dpkg --add-architecture arm64; the -dev:arm64
# packages scripts/install-deps.sh --arm64 lists). Used by scripts/test_arm64.sh:
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# The test programs then run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR below), so plain
# ctest works on an x86-64 host.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Libraries and headers come from the multiarch folders (/usr/lib/aarch64-linux-gnu,
# /usr/include); programs (cmake's helpers, python, bash) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config must read the arm64 .pc files only, never the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# Running the aarch64 test programs: user-mode emulation, started explicitly (no binfmt_misc
# registration needed). The programs load the multiarch arm64 C library (libc6:arm64, pulled in
# by the -dev:arm64 packages, /lib/ld-linux-aarch64.so.1), not the cross toolchain's copy under
# /usr/aarch64-linux-gnu: with `-L /usr/aarch64-linux-gnu` qemu takes that copy's loader while
# the other libraries come from the multiarch folders, and when the two glibc builds differ
# (Debian updates libc6:arm64, not libc6-arm64-cross) a program that starts a thread spins
# forever at pthread_create.
find_program(KVP_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(KVP_QEMU_AARCH64)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${KVP_QEMU_AARCH64})
endif()
