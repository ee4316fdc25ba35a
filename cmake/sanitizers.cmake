# Instrumented builds (issue 18), each in its own build folder (scripts/sanitize.sh, scripts/fuzz.sh):
#   KVFLASH_SANITIZE=address,undefined | thread   every target built with these sanitizers
#   KVFLASH_FUZZ=ON                               the libFuzzer targets of fuzz/ (clang only); the
#                                                 library gets coverage, ASan and UBSan too
# Included before any target is defined, so the flags reach the library.
set(KVFLASH_SANITIZE "" CACHE STRING "Sanitizers for every target (address,undefined or thread)")
option(KVFLASH_FUZZ "Build the libFuzzer targets in fuzz/ (clang)" OFF)

if(KVFLASH_SANITIZE)
  # Any report aborts the test that made it, so ctest fails on it.
  add_compile_options(-fsanitize=${KVFLASH_SANITIZE} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=${KVFLASH_SANITIZE})
endif()

if(KVFLASH_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KVFLASH_FUZZ needs clang (libFuzzer): CXX=clang++-14")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=address,undefined)
endif()
