# OpenBLASConfigVersion.cmake beside tools/windows/openblas-config.cmake (fetch_openblas.sh installs
# both): the version of the unpacked win_amd64 wheel, and "unsuitable" for anything but a 64-bit
# Windows target, so that a Linux configure pointed here by mistake says so instead of failing to link.
# The unpacked wheel: beside DEST/lib/cmake/openblas (fetch_openblas.sh), or CYXWIZ_OPENBLAS_WHEEL (the
# pip build on Windows points it at site-packages/scipy_openblas32 and finds this file in the tree).
if(DEFINED CYXWIZ_OPENBLAS_WHEEL)
  set(_OpenBLAS_WHEEL "${CYXWIZ_OPENBLAS_WHEEL}")
else()
  get_filename_component(_OpenBLAS_WHEEL "${CMAKE_CURRENT_LIST_DIR}/../../../scipy_openblas32" ABSOLUTE)
endif()
set(PACKAGE_VERSION "")
if(EXISTS "${_OpenBLAS_WHEEL}/include/openblas_config.h")
  file(STRINGS "${_OpenBLAS_WHEEL}/include/openblas_config.h" _OpenBLAS_VERSION_LINE
       REGEX "^#define OPENBLAS_VERSION ")
  string(REGEX MATCH "[0-9]+(\\.[0-9]+)+" PACKAGE_VERSION "${_OpenBLAS_VERSION_LINE}")
endif()
if(PACKAGE_VERSION STREQUAL "")
  set(PACKAGE_VERSION "0")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
elseif(PACKAGE_FIND_VERSION AND PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
if(NOT WIN32 OR NOT CMAKE_SIZEOF_VOID_P EQUAL 8)
  set(PACKAGE_VERSION "${PACKAGE_VERSION} (win_amd64)")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
unset(_OpenBLAS_WHEEL)
unset(_OpenBLAS_VERSION_LINE)
