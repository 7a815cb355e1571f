# libcyxwiz_cuda.so: GPU kernels, cuBLAS(Lt) and NCCL behind cyxwiz/cuda/api.h. _core opens it with
# dlopen on first GPU use, so `import pycyxwiz` never needs CUDA, a driver or a GPU.
#
# CYXWIZ_CUDA=AUTO (default) builds it when nvcc, cuBLAS, cuBLASLt and NCCL are all found, ON insists,
# OFF skips. cuBLAS/cuBLASLt and NCCL come from the CUDA toolkit / system, or from the nvidia-cublas
# and nvidia-nccl-cu13 wheels in the building Python's site-packages (found through the `nvidia`
# namespace package). cuDNN (convolution and pooling, cuda/cudnn.cpp) is optional: from the
# nvidia-cudnn-cu13 wheel or the system when found, else the library is built without it and its
# convolution calls say how to get it.
set(CYXWIZ_CUDA "AUTO" CACHE STRING "Build the CUDA library: AUTO, ON or OFF")
set(CYXWIZ_CUDA_ARCHITECTURES "80-real;90-real;100-real;90-virtual" CACHE STRING
    "GPU architectures for the CUDA kernels (Ampere, Hopper, Blackwell, plus PTX for newer GPUs)")
set(CYXWIZ_CUDA_BUILT OFF)
set(CYXWIZ_CUDA_REASON "")

function(cyxwiz_cuda_skip reason)
  if(CYXWIZ_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CYXWIZ_CUDA=ON but ${reason}")
  endif()
  message(STATUS "pycyxwiz: CPU-only build (${reason})")
  set(CYXWIZ_CUDA_REASON "${reason}" PARENT_SCOPE)
endfunction()

if(CYXWIZ_CUDA STREQUAL "OFF")
  set(CYXWIZ_CUDA_REASON "CYXWIZ_CUDA=OFF")
else()
  include(CheckLanguage)
  check_language(CUDA)
  # Wheel locations first: they match the CUDA 13 runtime the GPU machines carry.
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import nvidia, os; print(';'.join(os.path.abspath(p) for p in nvidia.__path__))"
    OUTPUT_VARIABLE CYXWIZ_NVIDIA_WHEEL_DIRS OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  set(wheel_include "")
  set(wheel_lib "")
  set(cudnn_include "")
  set(cudnn_lib "")
  foreach(d IN LISTS CYXWIZ_NVIDIA_WHEEL_DIRS)
    list(APPEND wheel_include "${d}/cu13/include" "${d}/nccl/include" "${d}/cublas/include")
    list(APPEND wheel_lib "${d}/cu13/lib" "${d}/nccl/lib" "${d}/cublas/lib")
    list(APPEND cudnn_include "${d}/cudnn/include" "${d}/cu13/include")
    list(APPEND cudnn_lib "${d}/cudnn/lib" "${d}/cu13/lib")
  endforeach()
  if(NOT CMAKE_CUDA_COMPILER)
    cyxwiz_cuda_skip("nvcc was not found")
  else()
    find_package(CUDAToolkit)
    find_path(CYXWIZ_CUBLAS_INCLUDE cublas_v2.h HINTS ${wheel_include} ${CUDAToolkit_INCLUDE_DIRS})
    find_library(CYXWIZ_CUBLAS_LIB NAMES cublas libcublas.so.13 libcublas.so.12 HINTS ${wheel_lib} ${CUDAToolkit_LIBRARY_DIR})
    find_library(CYXWIZ_CUBLASLT_LIB NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12
                 HINTS ${wheel_lib} ${CUDAToolkit_LIBRARY_DIR})
    find_path(CYXWIZ_NCCL_INCLUDE nccl.h HINTS ${wheel_include} ${CUDAToolkit_INCLUDE_DIRS})
    find_library(CYXWIZ_NCCL_LIB NAMES nccl libnccl.so.2 HINTS ${wheel_lib} ${CUDAToolkit_LIBRARY_DIR})
    # The wheel has only libcudnn.so.9 (no libcudnn.so link).
    find_path(CYXWIZ_CUDNN_INCLUDE cudnn.h HINTS ${cudnn_include} ${CUDAToolkit_INCLUDE_DIRS})
    find_library(CYXWIZ_CUDNN_LIB NAMES cudnn libcudnn.so.9 HINTS ${cudnn_lib} ${CUDAToolkit_LIBRARY_DIR})
    if(NOT CUDAToolkit_FOUND)
      cyxwiz_cuda_skip("the CUDA toolkit was not found")
    elseif(NOT CYXWIZ_CUBLAS_INCLUDE OR NOT CYXWIZ_CUBLAS_LIB)
      cyxwiz_cuda_skip("cuBLAS was not found (pip install nvidia-cublas, or the toolkit's libcublas)")
    elseif(NOT CYXWIZ_CUBLASLT_LIB)
      cyxwiz_cuda_skip("cuBLASLt was not found (pip install nvidia-cublas, or the toolkit's libcublasLt)")
    elseif(NOT CYXWIZ_NCCL_INCLUDE OR NOT CYXWIZ_NCCL_LIB)
      cyxwiz_cuda_skip("NCCL was not found (pip install nvidia-nccl-cu13)")
    else()
      set(CYXWIZ_CUDA_BUILT ON)
    endif()
  endif()
endif()

if(CYXWIZ_CUDA_BUILT)
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  file(GLOB CYXWIZ_CUDA_SOURCES CONFIGURE_DEPENDS cyxwiz/cuda/*.cu cyxwiz/cuda/*.cpp)
  add_library(cyxwiz_cuda SHARED ${CYXWIZ_CUDA_SOURCES})
  set_target_properties(cyxwiz_cuda PROPERTIES
    CUDA_ARCHITECTURES "${CYXWIZ_CUDA_ARCHITECTURES}"
    CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden)
  # Only the cuBLAS and NCCL headers, not the wheels' whole include folder: that also holds a newer
  # CUDA runtime's headers, which must not shadow the toolkit's that nvcc compiles and links with.
  set(vendor_include "${CMAKE_CURRENT_BINARY_DIR}/cyxwiz_vendor_include")
  file(MAKE_DIRECTORY "${vendor_include}")
  foreach(h cublas.h cublas_api.h cublas_v2.h cublasLt.h)
    file(CREATE_LINK "${CYXWIZ_CUBLAS_INCLUDE}/${h}" "${vendor_include}/${h}" SYMBOLIC)
  endforeach()
  file(CREATE_LINK "${CYXWIZ_NCCL_INCLUDE}/nccl.h" "${vendor_include}/nccl.h" SYMBOLIC)
  set(cudnn_rpath "")
  if(CYXWIZ_CUDNN_INCLUDE AND CYXWIZ_CUDNN_LIB)
    # cudnn.h includes its siblings (cudnn_version.h, cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h, ...): link them all.
    file(GLOB cudnn_headers "${CYXWIZ_CUDNN_INCLUDE}/cudnn*.h")
    foreach(h IN LISTS cudnn_headers)
      get_filename_component(name "${h}" NAME)
      file(CREATE_LINK "${h}" "${vendor_include}/${name}" SYMBOLIC)
    endforeach()
    # libcudnn.so.9 loads its sub-libraries (libcudnn_cnn, _ops, _engines_*) from its own folder.
    target_link_libraries(cyxwiz_cuda PRIVATE ${CYXWIZ_CUDNN_LIB})
    target_compile_definitions(cyxwiz_cuda PRIVATE CYXWIZ_HAVE_CUDNN=1)
    get_filename_component(cudnn_dir "${CYXWIZ_CUDNN_LIB}" DIRECTORY)
    set(cudnn_rpath ";$ORIGIN/../nvidia/cudnn/lib;${cudnn_dir}")
    message(STATUS "pycyxwiz: cuDNN ${CYXWIZ_CUDNN_LIB}")
  else()
    message(STATUS "pycyxwiz: cuDNN not found (pip install nvidia-cudnn-cu13): building without it; "
                   "convolution and pooling on GPUs will say so")
  endif()
  target_include_directories(cyxwiz_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} "${vendor_include}")
  # cuBLASLt is called directly (blas_lt.cpp), not only through cuBLAS; the static runtime needs no
  # libcudart at run time.
  target_link_libraries(cyxwiz_cuda PRIVATE CUDA::cudart_static ${CYXWIZ_CUBLAS_LIB} ${CYXWIZ_CUBLASLT_LIB}
                        ${CYXWIZ_NCCL_LIB})
  target_compile_options(cyxwiz_cuda PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O3 -Wall -Wextra> $<$<COMPILE_LANGUAGE:CUDA>:-O3>)
  string(REPLACE ";" " " archs "${CYXWIZ_CUDA_ARCHITECTURES}")  # a list would split the definition
  target_compile_definitions(cyxwiz_cuda PRIVATE "CYXWIZ_CUDA_ARCHITECTURES=\"${archs}\"")
  target_link_options(cyxwiz_cuda PRIVATE "LINKER:--version-script=${CMAKE_CURRENT_SOURCE_DIR}/cyxwiz/cuda/exports.map")
  # Found at run time beside us in site-packages (the wheels), else where the build found them.
  get_filename_component(cublas_dir "${CYXWIZ_CUBLAS_LIB}" DIRECTORY)
  get_filename_component(cublaslt_dir "${CYXWIZ_CUBLASLT_LIB}" DIRECTORY)
  get_filename_component(nccl_dir "${CYXWIZ_NCCL_LIB}" DIRECTORY)
  set_target_properties(cyxwiz_cuda PROPERTIES
    INSTALL_RPATH "$ORIGIN/../nvidia/cu13/lib;$ORIGIN/../nvidia/nccl/lib;$ORIGIN/../nvidia/cublas/lib;${cublas_dir};${cublaslt_dir};${nccl_dir}${cudnn_rpath}"
    BUILD_WITH_INSTALL_RPATH ON)
  install(TARGETS cyxwiz_cuda LIBRARY DESTINATION pycyxwiz)
endif()
