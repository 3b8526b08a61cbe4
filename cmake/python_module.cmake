# The Python module kvq._core needs Python's headers and nanobind (a PyPI package). Under
# scikit-build-core (`pip install .`) both come from the build environment; in the developer build
# they come from KVQ_PYTHON (.venv, where requirements.txt installs nanobind).
# Sets KVQ_PYTHON_MODULE_ENABLED.
set(KVQ_PYTHON_MODULE_ENABLED OFF)
if(NOT KVQ_PYTHON_MODULE STREQUAL "OFF")
  if(NOT SKBUILD AND NOT DEFINED Python_EXECUTABLE AND EXISTS "${KVQ_PYTHON}")
    set(Python_EXECUTABLE "${KVQ_PYTHON}")
  endif()
  find_package(Python 3.9 COMPONENTS Interpreter Development.Module)
  set(kvq_nanobind_dir "")
  if(Python_FOUND)
    execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                    OUTPUT_VARIABLE kvq_nanobind_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE kvq_nanobind_rc ERROR_QUIET)
    if(NOT kvq_nanobind_rc EQUAL 0)
      set(kvq_nanobind_dir "")
    endif()
  endif()
  if(kvq_nanobind_dir)
    find_package(nanobind CONFIG REQUIRED PATHS "${kvq_nanobind_dir}" NO_DEFAULT_PATH)
    set(KVQ_PYTHON_MODULE_ENABLED ON)
    message(STATUS "kvq: Python module on (Python ${Python_VERSION}, nanobind ${nanobind_VERSION})")
  elseif(KVQ_PYTHON_MODULE STREQUAL "ON")
    message(FATAL_ERROR "kvq: KVQ_PYTHON_MODULE=ON but ${Python_EXECUTABLE} has no nanobind or no "
                        "development headers (pip install nanobind; apt-get install python3-dev)")
  else()
    message(STATUS "kvq: Python module off (no Python with nanobind and headers: pip install nanobind)")
  endif()
endif()
