# Optional CUDA. KVQ_CUDA=AUTO enables it when a CUDA compiler is found; ON requires it.
# Architectures come from CMAKE_CUDA_ARCHITECTURES; the default targets Hopper (sm_90a, the GPU
# machine) and is overridable, e.g. -DCMAKE_CUDA_ARCHITECTURES="80;90a".
set(KVQ_CUDA_ENABLED OFF)
if(NOT KVQ_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90a)  # H100 / H200; add 80 for A100, 89 for L40S
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(KVQ_CUDA_ENABLED ON)
    message(STATUS "kvq: CUDA enabled (${CMAKE_CUDA_COMPILER_VERSION}), architectures ${CMAKE_CUDA_ARCHITECTURES}")
    if(KVQ_CUDA_COMPILE_CHECK)
      message(STATUS "kvq: KVQ_CUDA_COMPILE_CHECK: kernels compiled to check that they build (NVVM -O1); "
                     "timing them is refused")
    endif()
  elseif(KVQ_CUDA STREQUAL "ON")
    message(FATAL_ERROR "kvq: KVQ_CUDA=ON but no CUDA compiler was found (set CUDACXX or put nvcc on PATH)")
  else()
    message(STATUS "kvq: no CUDA compiler found; building the CPU core only")
  endif()
endif()
