# cuDNN for the CUDA backend: the library (libcudnn.so.9 and cudnn.h, from the CUDA image
# here and from python's nvidia-cudnn-cu13 on the GPU machine) and the cuDNN frontend's
# header-only C++ graph API, which scripts/setup.sh installs into .venv/ from PyPI
# (nvidia-cudnn-frontend; its wheel puts the headers in site-packages/include).
# Defines pentad::cudnn (an interface target) or stops the configure with what to do.
# Override with -DCUDNN_FRONTEND_INCLUDE_DIR=... or -DCUDNN_LIB=... -DCUDNN_INCLUDE_DIR=...

set(_pentad_pythons ${CMAKE_SOURCE_DIR}/.venv/bin/python)
find_program(_pentad_system_python python3)
if(_pentad_system_python)
  list(APPEND _pentad_pythons ${_pentad_system_python})
endif()
set(_pentad_frontend_hints "")
foreach(py ${_pentad_pythons})
  if(EXISTS ${py})
    # sysconfig only: importing cudnn would load its compiled module and libcudnn.
    execute_process(COMMAND ${py} -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
      OUTPUT_VARIABLE purelib OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND purelib)
      list(APPEND _pentad_frontend_hints ${purelib}/include)
    endif()
  endif()
endforeach()
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${_pentad_frontend_hints}
  NO_DEFAULT_PATH)
if(NOT CUDNN_FRONTEND_INCLUDE_DIR)
  message(FATAL_ERROR "pentad: the cuDNN frontend headers (cudnn_frontend.h) were not found in "
    "${_pentad_frontend_hints}. Run `bash scripts/setup.sh` (it installs the PyPI package "
    "nvidia-cudnn-frontend into .venv/), pass -DCUDNN_FRONTEND_INCLUDE_DIR=<dir>, or build "
    "without CUDA (-DPENTAD_CUDA=OFF).")
endif()

find_library(CUDNN_LIB cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_TARGET_DIR}
  PATH_SUFFIXES lib lib64)
find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(NOT CUDNN_LIB OR NOT CUDNN_INCLUDE_DIR)
  message(FATAL_ERROR "pentad: cuDNN 9 (libcudnn.so and cudnn.h) was not found next to the "
    "CUDA toolkit (${CUDAToolkit_LIBRARY_DIR}). Install cuDNN 9 for CUDA 13, pass "
    "-DCUDNN_LIB=<file> -DCUDNN_INCLUDE_DIR=<dir>, or build without CUDA (-DPENTAD_CUDA=OFF).")
endif()
message(STATUS "pentad: cuDNN ${CUDNN_LIB}, frontend headers ${CUDNN_FRONTEND_INCLUDE_DIR}")

add_library(pentad_cudnn INTERFACE)
add_library(pentad::cudnn ALIAS pentad_cudnn)
# SYSTEM: the frontend's headers are third-party code, outside pentad's -Werror.
target_include_directories(pentad_cudnn SYSTEM INTERFACE ${CUDNN_FRONTEND_INCLUDE_DIR}
  ${CUDNN_INCLUDE_DIR})
# NVRTC: the frontend's headers also hold engines it compiles at run time (none that
# attention uses), and their calls must link.
target_link_libraries(pentad_cudnn INTERFACE ${CUDNN_LIB} CUDA::nvrtc)
