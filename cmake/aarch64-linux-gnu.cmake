# CMake toolchain file: cross-build for aarch64 Linux with Debian's cross compiler
# (g++-aarch64-linux-gnu) against the arm64 multiarch packages (dpkg --add-architecture arm64;
# libhwy-dev:arm64, libgtest-dev:arm64, libstdc++6:arm64), running the built test binaries under qemu-user
# (qemu-aarch64; the CPU model from $QEMU_CPU). Used by scripts/test-aarch64.sh.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# The baseline -march (armv8-a+crypto) comes from the top-level CMakeLists.txt, as for a native build.
# The arm64 packages' .pc files only (not the host's).
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
# gtest_discover_tests() and ctest run the binaries through this. The dynamic loader and the C and
# C++ runtimes are the arm64 multiarch ones (/lib/ld-linux-aarch64.so.1, libc6:arm64,
# libstdc++6:arm64). Not -L /usr/aarch64-linux-gnu (the cross toolchain's copies): with qemu 7.2
# a program that starts a thread hangs there.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
