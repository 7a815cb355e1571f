# OpenBLASConfig.cmake for the win_amd64 wheel of scipy-openblas32, for MinGW-w64 builds (what it sets
# is what an MSVC build needs as well, but only MinGW-w64 has been tried).
# fetch_openblas.sh DEST installs it as DEST/lib/cmake/openblas/OpenBLASConfig.cmake beside the
# unpacked wheel (DEST/scipy_openblas32/...); then -DOpenBLAS_DIR=DEST/lib/cmake/openblas, or
# CMAKE_PREFIX_PATH=DEST, and find_package(OpenBLAS CONFIG) as on Linux.
#
# Why our own: the wheel's lib/cmake/openblas/OpenBLASConfig.cmake sets IMPORTED_LOCATION to the
# import library libscipy_openblas.lib (not the DLL) and IMPORTED_IMPLIB to lib/libopenblas.lib or
# lib/libopenblas.lib.a, neither of which the wheel ships, so a MinGW link fails on a missing file.
#
# Defines, like the wheel's config on Linux:
#   OpenBLAS::OpenBLAS       SHARED IMPORTED: IMPORTED_LOCATION the DLL, IMPORTED_IMPLIB the import
#                            library (a GNU-format archive: MinGW's ld links it as is), the headers
#                            (cblas.h declares the scipy_-prefixed names) as its include directory
#   OpenBLAS_VERSION         e.g. 0.3.34.481.3 (from the wheel's openblas_config.h)
#   OpenBLAS_INCLUDE_DIRS    DEST/scipy_openblas32/include
#   OpenBLAS_LIBRARIES       the import library (what a link line names)
# and, for running what is built:
#   OpenBLAS_DLL             DEST/scipy_openblas32/lib/libscipy_openblas.dll
#   OpenBLAS_RUNTIME_DIR     its folder: copy the DLL beside the .exe or put the folder on WINEPATH/PATH
# The DLL links the C runtime as UCRT (api-ms-win-crt-*.dll) and gfortran statically: it needs no
# other DLL. MinGW's default C runtime is msvcrt; only plain C values cross the BLAS interface, so the
# two runtimes do not meet.

# The unpacked wheel: beside DEST/lib/cmake/openblas (fetch_openblas.sh), or CYXWIZ_OPENBLAS_WHEEL (the
# pip build on Windows points it at site-packages/scipy_openblas32 and finds this file in the tree).
if(DEFINED CYXWIZ_OPENBLAS_WHEEL)
  set(_OpenBLAS_WHEEL "${CYXWIZ_OPENBLAS_WHEEL}")
else()
  get_filename_component(_OpenBLAS_WHEEL "${CMAKE_CURRENT_LIST_DIR}/../../../scipy_openblas32" ABSOLUTE)
endif()
set(_OpenBLAS_IMPLIB "${_OpenBLAS_WHEEL}/lib/libscipy_openblas.lib")
set(_OpenBLAS_DLL "${_OpenBLAS_WHEEL}/lib/libscipy_openblas.dll")

if(NOT WIN32)
  set(OpenBLAS_FOUND FALSE)
  set(OpenBLAS_NOT_FOUND_MESSAGE "${CMAKE_CURRENT_LIST_FILE} is the Windows build of scipy-openblas32; "
      "this build targets ${CMAKE_SYSTEM_NAME} (cross-compiling needs -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64.cmake)")
  return()
endif()
foreach(_f "${_OpenBLAS_IMPLIB}" "${_OpenBLAS_DLL}" "${_OpenBLAS_WHEEL}/include/cblas.h")
  if(NOT EXISTS "${_f}")
    set(OpenBLAS_FOUND FALSE)
    set(OpenBLAS_NOT_FOUND_MESSAGE "${_f} is missing: rerun tools/windows/fetch_openblas.sh")
    return()
  endif()
endforeach()

file(STRINGS "${_OpenBLAS_WHEEL}/include/openblas_config.h" _OpenBLAS_VERSION_LINE
     REGEX "^#define OPENBLAS_VERSION ")
string(REGEX MATCH "[0-9]+(\\.[0-9]+)+" OpenBLAS_VERSION "${_OpenBLAS_VERSION_LINE}")

set(OpenBLAS_INCLUDE_DIRS "${_OpenBLAS_WHEEL}/include")
set(OpenBLAS_LIBRARIES "${_OpenBLAS_IMPLIB}")
set(OpenBLAS_DLL "${_OpenBLAS_DLL}")
set(OpenBLAS_RUNTIME_DIR "${_OpenBLAS_WHEEL}/lib")

if(NOT TARGET OpenBLAS::OpenBLAS)
  add_library(OpenBLAS::OpenBLAS SHARED IMPORTED)
  set_target_properties(OpenBLAS::OpenBLAS PROPERTIES
    IMPORTED_LOCATION "${_OpenBLAS_DLL}"
    IMPORTED_IMPLIB "${_OpenBLAS_IMPLIB}"
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}")
endif()
unset(_OpenBLAS_WHEEL)
unset(_OpenBLAS_IMPLIB)
unset(_OpenBLAS_DLL)
unset(_OpenBLAS_VERSION_LINE)
unset(_f)
