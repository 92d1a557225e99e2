# The layering the code must keep (docs/ARCHITECTURE: data flows one way), checked as a test
# (ctest -R layering): run with `cmake -DROOT=<repository> -P tests/layering_check.cmake`.
#   - python/ (the extension module) includes nothing of cli/ and does not link the CLI's
#     library: flashjit.tune() goes through tuner/tune_run.hpp, `python -m flashjit` runs the
#     shipped executable;
#   - tuner/, runtime/ and generator/ include nothing of cli/ or python/.
# Fails naming every file and line that breaks it.
if(NOT ROOT)
  message(FATAL_ERROR "pass -DROOT=<the repository>")
endif()
set(violations "")
macro(forbid_includes folder pattern)
  file(GLOB_RECURSE files ${ROOT}/${folder}/*.cpp ${ROOT}/${folder}/*.hpp ${ROOT}/${folder}/*.h)
  foreach(file IN LISTS files)
    file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<](${pattern})/")
    foreach(line IN LISTS lines)
      file(RELATIVE_PATH rel ${ROOT} ${file})
      string(STRIP "${line}" line)
      string(APPEND violations "  ${rel}: ${line}\n")
    endforeach()
  endforeach()
endmacro()
forbid_includes(python "cli")
forbid_includes(tuner "cli|python")
forbid_includes(runtime "cli|python|tuner")
forbid_includes(generator "cli|python|tuner|runtime")
file(STRINGS ${ROOT}/python/CMakeLists.txt links REGEX "target_link_libraries\\(_flashjit.*cli")
foreach(line IN LISTS links)
  string(APPEND violations "  python/CMakeLists.txt: ${line}\n")
endforeach()
if(violations)
  message(FATAL_ERROR "layering broken (python/ must not use cli/; tuner/, runtime/, generator/ "
                      "must not include the layers above them):\n${violations}")
endif()
message(STATUS "layering: ok")
