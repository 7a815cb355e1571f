# CMake toolchain file: cross-compile for Windows x86_64 with Debian's MinGW-w64 compilers, the
# posix-thread flavour (x86_64-w64-mingw32-gcc-posix / -g++-posix: std::thread, std::mutex and
# std::condition_variable work, on top of winpthreads; the -win32 flavour has no std::thread in GCC 12).
#
#   apt-get install g++-mingw-w64-x86-64-posix wine64        # wine only to run the results here
#   cmake -S <src> -B build-win -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64.cmake \
#         -DOpenBLAS_DIR=<dest>/lib/cmake/openblas             # tools/windows/fetch_openblas.sh <dest>
#   cmake --build build-win
#
# Options (cache variables, set with -D on the first configure):
#   CYXWIZ_MINGW_TRIPLE          compiler prefix, default x86_64-w64-mingw32
#   CYXWIZ_MINGW_SUFFIX          compiler suffix, default -posix
#   CYXWIZ_MINGW_STATIC_RUNTIME  ON (default) / OFF, see below
#
# The C/C++ runtime of MinGW: CYXWIZ_MINGW_STATIC_RUNTIME=ON (the default) links executables and
# DLLs/modules with -static, which puts libgcc, libstdc++ and libwinpthread inside each .exe/.dll.
# A binary then needs only Windows' own DLLs (KERNEL32, msvcrt, ...) and the DLLs of the project's
# dependencies (libscipy_openblas.dll), so it runs under Wine, or is shipped, without copying MinGW
# DLLs. It is only the MinGW runtime that becomes static: a dependency that is linked through an
# import library (OpenBLAS::OpenBLAS -> libscipy_openblas.lib) stays a DLL. The price: each
# binary carries its own copy of libstdc++ (~1 MB), and two DLLs that both link it statically must
# not hand each other C++ objects (exceptions, std::string, ...) across their boundary. The engine's
# core is a static library linked into one binary (an .exe, or the _core .pyd, where a static
# runtime is also what keeps it apart from other extensions' libstdc++), so this does not arise.
# With OFF, GCC's default, copy these beside the .exe (or put their folders on WINEPATH / PATH):
#   /usr/lib/gcc/x86_64-w64-mingw32/12-posix/libstdc++-6.dll
#   /usr/lib/gcc/x86_64-w64-mingw32/12-posix/libgcc_s_seh-1.dll
#   /usr/x86_64-w64-mingw32/lib/libwinpthread-1.dll
# (x86_64-w64-mingw32-objdump -p <file> | grep 'DLL Name' lists what a binary imports.)
#
# Running the results: when wine is on PATH it becomes CMAKE_CROSSCOMPILING_EMULATOR (with
# WINEDEBUG=-all), so add_test()/ctest and try_run() execute the .exe files through it. DLLs
# outside the .exe's folder are found through WINEPATH (tools/windows/README.md).

set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR AMD64)

set(CYXWIZ_MINGW_TRIPLE "x86_64-w64-mingw32" CACHE STRING "MinGW-w64 compiler prefix")
set(CYXWIZ_MINGW_SUFFIX "-posix" CACHE STRING "MinGW-w64 compiler suffix (-posix: threads via winpthreads)")
option(CYXWIZ_MINGW_STATIC_RUNTIME "Link libgcc, libstdc++ and libwinpthread statically" ON)
# try_compile() projects re-read this file: hand them the same choices.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES
     CYXWIZ_MINGW_TRIPLE CYXWIZ_MINGW_SUFFIX CYXWIZ_MINGW_STATIC_RUNTIME)

find_program(CYXWIZ_MINGW_CC  NAMES ${CYXWIZ_MINGW_TRIPLE}-gcc${CYXWIZ_MINGW_SUFFIX})
find_program(CYXWIZ_MINGW_CXX NAMES ${CYXWIZ_MINGW_TRIPLE}-g++${CYXWIZ_MINGW_SUFFIX})
if(NOT CYXWIZ_MINGW_CC OR NOT CYXWIZ_MINGW_CXX)
  message(FATAL_ERROR "mingw-w64.cmake: ${CYXWIZ_MINGW_TRIPLE}-g++${CYXWIZ_MINGW_SUFFIX} not found "
                      "(Debian: apt-get install g++-mingw-w64-x86-64-posix)")
endif()
set(CMAKE_C_COMPILER   "${CYXWIZ_MINGW_CC}")
set(CMAKE_CXX_COMPILER "${CYXWIZ_MINGW_CXX}")
find_program(CYXWIZ_MINGW_WINDRES NAMES ${CYXWIZ_MINGW_TRIPLE}-windres)
if(CYXWIZ_MINGW_WINDRES)
  set(CMAKE_RC_COMPILER "${CYXWIZ_MINGW_WINDRES}")
endif()

# Headers, libraries and CMake packages come from the target's sysroot (and from whatever is added
# to CMAKE_FIND_ROOT_PATH / given as <Pkg>_DIR); programs (python, git, wine) from the build host.
set(CMAKE_FIND_ROOT_PATH "/usr/${CYXWIZ_MINGW_TRIPLE}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
# BOTH, not ONLY, for packages: the Windows OpenBLAS is unpacked in an ordinary host folder
# (fetch_openblas.sh DEST), and ONLY would re-root a PATHS/CMAKE_PREFIX_PATH entry such as DEST
# under /usr/x86_64-w64-mingw32. <Pkg>_DIR is used as given in either mode.
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

if(CYXWIZ_MINGW_STATIC_RUNTIME)
  set(CMAKE_EXE_LINKER_FLAGS_INIT    "-static")
  set(CMAKE_SHARED_LINKER_FLAGS_INIT "-static")
  set(CMAKE_MODULE_LINKER_FLAGS_INIT "-static")
endif()

if(NOT DEFINED CMAKE_CROSSCOMPILING_EMULATOR)
  find_program(CYXWIZ_WINE NAMES wine wine64)
  if(CYXWIZ_WINE)
    # env: WINEDEBUG=-all silences Wine's fixme/err lines (and Debian's "wine32 is missing" hint).
    set(CMAKE_CROSSCOMPILING_EMULATOR "/usr/bin/env;WINEDEBUG=-all;${CYXWIZ_WINE}")
  endif()
endif()
