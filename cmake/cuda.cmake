# The CUDA backend (included by CMakeLists.txt when nvcc is found). Adds src/cuda/*.cu to kvflash_lib.
#
#   KVFLASH_CUDA_MINIMAL=ON   one head dim (128), bf16 only, sm_80 only: the set CI compiles so a
#                             compile break never lands while CI stays within its 2-core budget.
#   KVFLASH_CUTLASS_INCLUDE   CUTLASS/CuTe headers (default: the pinned PyPI nvidia-cutlass==4.2.0.0).
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

option(KVFLASH_CUDA_MINIMAL "Build one attention instantiation (bf16, d 128, sm_80) for CI" OFF)

if(NOT KVFLASH_CUTLASS_INCLUDE)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
        "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
      OUTPUT_VARIABLE _kvflash_cutlass OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(NOT _kvflash_cutlass AND EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/.cutlass/include")
    set(_kvflash_cutlass "${CMAKE_CURRENT_SOURCE_DIR}/.cutlass/include")
  endif()
  set(KVFLASH_CUTLASS_INCLUDE "${_kvflash_cutlass}" CACHE PATH "CUTLASS/CuTe include folder")
endif()
if(KVFLASH_CUTLASS_INCLUDE AND EXISTS "${KVFLASH_CUTLASS_INCLUDE}/cute")
  message(STATUS "kvflash: CUTLASS headers at ${KVFLASH_CUTLASS_INCLUDE}")
  target_include_directories(kvflash_lib PRIVATE "${KVFLASH_CUTLASS_INCLUDE}")
else()
  message(STATUS "kvflash: CUTLASS headers not found (pip install nvidia-cutlass==4.2.0.0); not needed yet")
endif()

file(GLOB KVFLASH_CUDA_SOURCES CONFIGURE_DEPENDS src/cuda/*.cu)
if(KVFLASH_CUDA_MINIMAL)
  # Keep every kernel file but only one attention instantiation file.
  list(FILTER KVFLASH_CUDA_SOURCES EXCLUDE REGEX "attention_inst_.*\\.cu$")
  list(APPEND KVFLASH_CUDA_SOURCES src/cuda/attention_inst_bf16_hdim128.cu)
  target_compile_definitions(kvflash_lib PRIVATE KVFLASH_CUDA_MINIMAL=1)
  set(_kvflash_archs 80)
else()
  # The architectures of the portable kernels (a GPU-machine-only build may name just its own).
  set(KVFLASH_CUDA_ARCHS "80;90a" CACHE STRING "CUDA architectures of the portable kernels (full builds)")
  set(_kvflash_archs ${KVFLASH_CUDA_ARCHS})
endif()

target_sources(kvflash_lib PRIVATE ${KVFLASH_CUDA_SOURCES} src/cuda/sm90/prefill_rule.cpp)
set_target_properties(kvflash_lib PROPERTIES CUDA_ARCHITECTURES "${_kvflash_archs}")

# CUDA takes the project's C++20; CMake 3.25 does not know nvcc 13's flag for it.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
target_compile_options(kvflash_lib PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xptxas=--warn-on-spills>)
target_compile_definitions(kvflash_lib PUBLIC KVFLASH_WITH_CUDA=1)
target_link_libraries(kvflash_lib PUBLIC CUDA::cudart_static)

# The Hopper prefill family (src/cuda/sm90): wgmma / TMA / setmaxnreg exist only on sm_90a, so its
# files build apart, for that target alone, and only in full builds with the CUTLASS headers (CI's
# minimal build leaves them out: sm90::prefill_takes then says no and the sm80 kernels run).
if(NOT KVFLASH_CUDA_MINIMAL AND KVFLASH_CUTLASS_INCLUDE AND EXISTS "${KVFLASH_CUTLASS_INCLUDE}/cute")
  file(GLOB KVFLASH_SM90_SOURCES CONFIGURE_DEPENDS src/cuda/sm90/*.cu)
  add_library(kvflash_sm90 OBJECT ${KVFLASH_SM90_SOURCES})
  set_target_properties(kvflash_sm90 PROPERTIES CUDA_ARCHITECTURES 90a CUDA_STANDARD 20)
  target_include_directories(kvflash_sm90 PRIVATE include src "${KVFLASH_CUTLASS_INCLUDE}")
  target_compile_options(kvflash_sm90 PRIVATE --expt-relaxed-constexpr -lineinfo -Xptxas=--warn-on-spills)
  target_sources(kvflash_lib PRIVATE $<TARGET_OBJECTS:kvflash_sm90>)
  target_compile_definitions(kvflash_lib PRIVATE KVFLASH_WITH_SM90=1)
endif()

# The GPU test runner (tests/gpu/run.sh builds and runs it on a GPU machine).
option(KVFLASH_GPU_TESTS "Build tests/gpu's kvflash_gpu_runner" OFF)
if(KVFLASH_GPU_TESTS)
  file(GLOB KVFLASH_GPU_TEST_SOURCES CONFIGURE_DEPENDS tests/gpu/*.cpp)
  add_executable(kvflash_gpu_runner ${KVFLASH_GPU_TEST_SOURCES})
  if(TARGET kvflash_sm90)
    target_compile_definitions(kvflash_gpu_runner PRIVATE KVFLASH_WITH_SM90=1)
  endif()
  target_include_directories(kvflash_gpu_runner PRIVATE src tests)
  target_link_libraries(kvflash_gpu_runner PRIVATE kvflash_lib kvflash_oracle CUDA::cudart_static)
endif()
