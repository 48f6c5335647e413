# CMake toolchain file that makes Horovod 0.28.1 compile as C++17 (torch >= 2.1 needs it), and
# without debug information (a shorter build, a smaller wheel; cxx17-override.cmake says why).
# Horovod's CMakeLists set CMAKE_CXX_STANDARD 14 and strip -std= from CXXFLAGS, so instead we
# change what "C++11/14" means to the compiler: the override file below is read right after
# CMake's own GNU/Clang rules and maps both standards' flags to C++17.
# Given through the CMAKE_TOOLCHAIN_FILE environment variable (CMake >= 3.21) by
# scripts/install-horovod.sh, for the one `pip wheel` call that builds Horovod.
# Upstream: https://github.com/horovod/horovod/issues/3996 and /4014 (fixed on master, PR #3998).
set(CMAKE_USER_MAKE_RULES_OVERRIDE_CXX "${CMAKE_CURRENT_LIST_DIR}/cxx17-override.cmake")
