# `cmake --install` of the plain (no Python) build: the static library, its headers and a CMake
# package, so that find_package(cyxwiz CONFIG REQUIRED) and target_link_libraries(app PRIVATE
# cyxwiz::core) build a C++ program with nothing else to name: the BLAS, threads and the dynamic loader
# come with the target as its usage requirements.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(cyxwiz_core PROPERTIES EXPORT_NAME core OUTPUT_NAME cyxwiz)
install(TARGETS cyxwiz_core EXPORT cyxwizTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY cyxwiz DESTINATION include FILES_MATCHING PATTERN "*.h")
install(EXPORT cyxwizTargets NAMESPACE cyxwiz:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cyxwiz)

# Where the BLAS's CMake config was at build time: a hint, so that a consumer on the same machine
# needs no OpenBLAS_DIR of its own.
set(CYXWIZ_OPENBLAS_HINT "${OpenBLAS_DIR}")
configure_package_config_file(cyxwizConfig.cmake.in "${CMAKE_CURRENT_BINARY_DIR}/cyxwizConfig.cmake"
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cyxwiz)
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/cyxwizConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/cyxwizConfig.cmake" "${CMAKE_CURRENT_BINARY_DIR}/cyxwizConfigVersion.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cyxwiz)
