# The shared library and the installed package (included by CMakeLists.txt).
#
#   libkvflash.a    kvflash_lib, target kvflash::kvflash (C++ API and C ABI)
#   libkvflash.so   kvflash_shared, target kvflash::kvflash_shared: the same objects, for ctypes
#                   and other FFI callers of the C ABI (include/kvflash/c_api.h)
#   include/kvflash/*.h, lib/cmake/kvflash/kvflashConfig.cmake (+ version file, targets),
#   lib/pkgconfig/kvflash.pc
#
# Consumers: find_package(kvflash 0.1 REQUIRED) + target_link_libraries(app kvflash::kvflash),
# or pkg-config --cflags --libs kvflash (shared) / pkg-config --static ... (static).

include(CMakePackageConfigHelpers)

# The whole static archive inside one shared object: no second compilation of the sources. CMake
# wants a source file per library: an empty one, generated.
file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/kvflash_shared.cpp" CONTENT "// libkvflash.so: libkvflash.a linked whole\n")
add_library(kvflash_shared SHARED "${PROJECT_BINARY_DIR}/kvflash_shared.cpp")
add_library(kvflash::kvflash_shared ALIAS kvflash_shared)
set_target_properties(kvflash_shared PROPERTIES
  OUTPUT_NAME kvflash EXPORT_NAME kvflash_shared
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
target_include_directories(kvflash_shared PRIVATE src
  PUBLIC "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include;${PROJECT_BINARY_DIR}/include>"
         "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
target_link_libraries(kvflash_shared PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,kvflash_lib>")
# What kvflash_lib's objects need at run time (OpenMP, Threads; CUDA's runtime is static).
target_link_libraries(kvflash_shared PRIVATE Threads::Threads $<$<BOOL:${OpenMP_CXX_FOUND}>:OpenMP::OpenMP_CXX>)
if(KVFLASH_WITH_CUDA)
  target_link_libraries(kvflash_shared PRIVATE CUDA::cudart_static)
endif()

if(NOT KVFLASH_INSTALL)
  return()
endif()

set(_kvflash_cmake_dir "${CMAKE_INSTALL_LIBDIR}/cmake/kvflash")
install(DIRECTORY include/kvflash "${PROJECT_BINARY_DIR}/include/kvflash"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT dev FILES_MATCHING PATTERN "*.h")
install(TARGETS kvflash_lib kvflash_shared EXPORT kvflashTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT dev
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT runtime)
install(EXPORT kvflashTargets NAMESPACE kvflash:: DESTINATION "${_kvflash_cmake_dir}" COMPONENT dev)

configure_package_config_file(cmake/kvflashConfig.cmake.in "${PROJECT_BINARY_DIR}/kvflashConfig.cmake"
                              INSTALL_DESTINATION "${_kvflash_cmake_dir}")
# Until 1.0 a minor release may change the API (docs/abi.md): SameMinorVersion.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/kvflashConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/kvflashConfig.cmake" "${PROJECT_BINARY_DIR}/kvflashConfigVersion.cmake"
        DESTINATION "${_kvflash_cmake_dir}" COMPONENT dev)

# pkg-config: Libs for the shared library; Libs.private what a static link adds.
set(KVFLASH_PC_LIBS_PRIVATE "-lpthread")
if(OpenMP_CXX_FOUND)
  string(PREPEND KVFLASH_PC_LIBS_PRIVATE "${OpenMP_CXX_FLAGS} ")
endif()
if(KVFLASH_WITH_CUDA)
  string(APPEND KVFLASH_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
endif()
# Relocatable: the prefix is found from the .pc file's own place (cmake --install --prefix works).
file(RELATIVE_PATH KVFLASH_PC_PREFIX_FROM_PCFILEDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" KVFLASH_PC_PREFIX_FROM_PCFILEDIR "${KVFLASH_PC_PREFIX_FROM_PCFILEDIR}")
configure_file(cmake/kvflash.pc.in "${PROJECT_BINARY_DIR}/kvflash.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/kvflash.pc" DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig" COMPONENT dev)
