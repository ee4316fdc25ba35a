# The CUDA backend (included by CMakeLists.txt when nvcc is found): src/cuda/*.cu and ops/ into
# kvflash_lib, the attention instantiations generated from src/cuda/instantiations.def.
#
#   KVFLASH_CUDA_MINIMAL=ON   the table's rows marked minimal (bf16 and bf16 over an fp8 cache,
#                             d 128), sm_80 only: the set CI
#                             compiles so a compile break never lands within CI's 2-core budget.
#   KVFLASH_CUTLASS_INCLUDE   CUTLASS/CuTe headers (default: the pinned PyPI nvidia-cutlass==4.2.0.0).
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

option(KVFLASH_CUDA_MINIMAL "Build the minimal attention instantiations (bf16 d 128, also over fp8; sm_80) for CI" OFF)

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
else()
  message(STATUS "kvflash: CUTLASS headers not found (pip install nvidia-cutlass==4.2.0.0); not needed yet")
endif()

# Flags every CUDA file of kvflash takes (kvflash_lib's own and the families' object libraries).
add_library(kvflash_cuda_flags INTERFACE)
# CUDA takes the project's C++20; CMake 3.25 does not know nvcc 13's flag for it.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
target_compile_options(kvflash_cuda_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xptxas=--warn-on-spills>)
target_compile_definitions(kvflash_cuda_flags INTERFACE KVFLASH_WITH_CUDA=1)
target_include_directories(kvflash_cuda_flags INTERFACE
  "${CMAKE_CURRENT_SOURCE_DIR}/include" "${CMAKE_CURRENT_SOURCE_DIR}/src")
if(KVFLASH_CUTLASS_INCLUDE AND EXISTS "${KVFLASH_CUTLASS_INCLUDE}/cute")
  target_include_directories(kvflash_cuda_flags INTERFACE "${KVFLASH_CUTLASS_INCLUDE}")
endif()

# Architectures: sm_80 for the portable kernels (run on any later GPU too) and sm_90a for Hopper.
if(KVFLASH_CUDA_MINIMAL)
  target_compile_definitions(kvflash_cuda_flags INTERFACE KVFLASH_CUDA_MINIMAL=1)
  set(_kvflash_archs 80)
else()
  set(_kvflash_archs 80 90a)
endif()
# Kernel families (src/cuda/<family>/) and the architectures each one's files compile for (those
# of this build among them): its own .cu files and its generated instantiation units go into an
# object library kvflash_cuda_<family> built for those architectures only.
set(KVFLASH_FAMILIES sm80 sm90 sm90_mla)
set(KVFLASH_FAMILY_ARCHS_sm80 80 90a)
# The Hopper families (wgmma, TMA, setmaxnreg: sm_90a only) are written with CuTe: without the
# CUTLASS headers they are not built (their rows are skipped; the rule still picks them on sm_90,
# and the dispatcher then says the kernel is not in this build).
if(KVFLASH_CUTLASS_INCLUDE AND EXISTS "${KVFLASH_CUTLASS_INCLUDE}/cute")
  set(KVFLASH_FAMILY_ARCHS_sm90 90a)
  set(KVFLASH_FAMILY_ARCHS_sm90_mla 90a)
endif()
foreach(_family IN LISTS KVFLASH_FAMILIES)
  set(_archs "")
  foreach(_arch IN LISTS KVFLASH_FAMILY_ARCHS_${_family})
    if(_arch IN_LIST _kvflash_archs)
      list(APPEND _archs ${_arch})
    endif()
  endforeach()
  if(_archs)
    file(GLOB _sources CONFIGURE_DEPENDS src/cuda/${_family}/*.cu)
    add_library(kvflash_cuda_${_family} OBJECT ${_sources})
    set_target_properties(kvflash_cuda_${_family} PROPERTIES CUDA_ARCHITECTURES "${_archs}")
    target_link_libraries(kvflash_cuda_${_family} PRIVATE kvflash_cuda_flags)
    target_sources(kvflash_lib PRIVATE $<TARGET_OBJECTS:kvflash_cuda_${_family}>)
  endif()
endforeach()

# The shared files: the dispatcher and ops/ (append + rotary, prepare, combine), for every arch.
file(GLOB KVFLASH_CUDA_SOURCES CONFIGURE_DEPENDS src/cuda/*.cu src/cuda/ops/*.cu)
target_sources(kvflash_lib PRIVATE ${KVFLASH_CUDA_SOURCES})
set_target_properties(kvflash_lib PROPERTIES CUDA_ARCHITECTURES "${_kvflash_archs}")
# BUILD_INTERFACE: compile flags only, nothing the installed package needs (cmake/package.cmake).
target_link_libraries(kvflash_lib PRIVATE $<BUILD_INTERFACE:kvflash_cuda_flags>)
target_compile_definitions(kvflash_lib PUBLIC KVFLASH_WITH_CUDA=1)

# The instantiation table (src/cuda/instantiations.def): one generated unit per row, in its
# family's object library, and the list of the built rows the dispatcher includes
# (kvflash_inst/built_instantiations.inc).
set(_kvflash_table "${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/instantiations.def")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_kvflash_table}")
file(STRINGS "${_kvflash_table}" _kvflash_rows REGEX "^KVFLASH_INSTANTIATION\\(")
set(_kvflash_gen "${CMAKE_CURRENT_BINARY_DIR}/kvflash_inst")
set(_kvflash_built "")
foreach(_row IN LISTS _kvflash_rows)
  if(NOT _row MATCHES "^KVFLASH_INSTANTIATION\\(([a-z0-9_]+), *([a-z0-9_]+), *([0-9]+), *([0-9]+)\\)")
    message(FATAL_ERROR "instantiations.def: cannot read the row '${_row}'")
  endif()
  set(_family ${CMAKE_MATCH_1})
  set(_dtype ${CMAKE_MATCH_2})
  set(_d ${CMAKE_MATCH_3})
  set(_dv ${CMAKE_MATCH_4})
  if(NOT _family IN_LIST KVFLASH_FAMILIES)
    message(FATAL_ERROR "instantiations.def: ${_family} is not in KVFLASH_FAMILIES")
  endif()
  if((KVFLASH_CUDA_MINIMAL AND NOT _row MATCHES "// minimal") OR NOT TARGET kvflash_cuda_${_family})
    continue()
  endif()
  # The launcher's row type: the query's 16-bit type, E4m3Cache<it> over an fp8 cache, or
  # __nv_fp8_e4m3 for the kernels that read all three as e4m3 (FA3's all-fp8 call).
  if(_dtype STREQUAL "e4m3")
    set(_elem __nv_fp8_e4m3)
  elseif(_dtype MATCHES "^bf16")
    set(_elem __nv_bfloat16)
  else()
    set(_elem __half)
  endif()
  if(_dtype MATCHES "_e4m3$")
    set(_elem "E4m3Cache<${_elem}>")
  endif()
  set(_unit "${_kvflash_gen}/${_family}_${_dtype}_${_d}x${_dv}.cu")
  file(CONFIGURE OUTPUT "${_unit}" CONTENT "\
// Generated by cmake/cuda.cmake from src/cuda/instantiations.def: do not edit.
#include \"cuda/${_family}/launch.cuh\"

namespace kvflash::cuda {
template void launch_${_family}_attention<${_elem}, ${_d}, ${_dv}>(const AttentionParams&, KernelShape, bool,
                                                                  cudaStream_t);
}  // namespace kvflash::cuda
")
  target_sources(kvflash_cuda_${_family} PRIVATE "${_unit}")
  string(APPEND _kvflash_built "KVFLASH_INSTANTIATION(${_family}, ${_dtype}, ${_d}, ${_dv})\n")
endforeach()
file(CONFIGURE OUTPUT "${_kvflash_gen}/built_instantiations.inc" CONTENT "${_kvflash_built}")
target_include_directories(kvflash_lib PRIVATE "${_kvflash_gen}")
target_link_libraries(kvflash_lib PUBLIC CUDA::cudart_static)

# The GPU test runner (tests/gpu/run.sh builds and runs it on a GPU machine).
option(KVFLASH_GPU_TESTS "Build tests/gpu's kvflash_gpu_runner" OFF)
if(KVFLASH_GPU_TESTS)
  file(GLOB KVFLASH_GPU_TEST_SOURCES CONFIGURE_DEPENDS tests/gpu/*.cpp)
  add_executable(kvflash_gpu_runner ${KVFLASH_GPU_TEST_SOURCES})
  # The Hopper families' kernels are timed directly (sm90_bench.cpp) and asked for by name.
  if(TARGET kvflash_cuda_sm90 AND TARGET kvflash_cuda_sm90_mla)
    target_compile_definitions(kvflash_gpu_runner PRIVATE KVFLASH_WITH_SM90=1)
  endif()
  target_include_directories(kvflash_gpu_runner PRIVATE src tests)
  target_link_libraries(kvflash_gpu_runner PRIVATE kvflash_lib kvflash_oracle CUDA::cudart_static)
endif()
