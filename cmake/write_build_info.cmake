# Run at every build (cmake -P): writes build_info.hpp with the current git commit, touching the
# file only when the commit changes so that nothing rebuilds needlessly.
# KVQ_COMMIT, when set, wins: a tree shipped to a GPU machine may carry a stale .git.
if(DEFINED ENV{KVQ_COMMIT} AND NOT "$ENV{KVQ_COMMIT}" STREQUAL "")
  set(commit "$ENV{KVQ_COMMIT}")
else()
  execute_process(COMMAND git describe --always --dirty --abbrev=12
                  WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR commit STREQUAL "")
    set(commit "unknown")
  endif()
endif()
set(content "#pragma once\n#define KVQ_VERSION \"${VERSION}\"\n#define KVQ_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT old STREQUAL content)
  file(WRITE ${OUTPUT} "${content}")
endif()
