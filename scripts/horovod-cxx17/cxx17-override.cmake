# Read by CMake after its compiler rules (see toolchain.cmake): whatever C++ standard a target
# asks for (11 or 14), compile it as C++17 (GNU extensions kept when the target wants them).
foreach(std 11 14)
  set(CMAKE_CXX${std}_STANDARD_COMPILE_OPTION "-std=c++17")
  set(CMAKE_CXX${std}_EXTENSION_COMPILE_OPTION "-std=gnu++17")
endforeach()
