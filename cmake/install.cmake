# `cmake --install`: the C++ package (headers, libraries, the flashjit CLI, the package config
# for find_package(flashjit)). Included by CMakeLists.txt when not building the Python module
# (pyproject.toml installs only the module and the shipped tuning DBs).
#
# Layout under the prefix (relocatable: nothing in it names the prefix):
#   bin/flashjit, bin/flashjit-hiprtc-worker (HIP builds)
#   include/flashjit/{generator,runtime,tuner,templates}/...   "runtime/runtime.hpp" etc.
#   lib/libflashjit*.a (or .so with -DBUILD_SHARED_LIBS=ON)
#   lib/cmake/flashjit/flashjit{Config,ConfigVersion,Targets}.cmake
#   share/flashjit/tuning/*.db   the shipped (system) tuning DBs, read-only (cmake/tuning_dbs.cmake)
# The kernel templates are compiled into the library (templates/embedded.hpp): nothing is read
# from the install tree at run time but the tuning DBs.
include(CMakePackageConfigHelpers)

set(FLASHJIT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashjit)

# Headers: the public API and everything it includes (no kernel templates: they are embedded).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/generator ${PROJECT_SOURCE_DIR}/runtime
                  ${PROJECT_SOURCE_DIR}/tuner
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashjit FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_SOURCE_DIR}/templates/attention_params.h
              ${PROJECT_SOURCE_DIR}/templates/embedded.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashjit/templates)

# flashjit_tuner is exported as flashjit::tuner: tuning from C++ (tuner/tune_run.hpp).
set_target_properties(flashjit_tuner PROPERTIES EXPORT_NAME tuner)
set(flashjit_exported flashjit flashjit_generator flashjit_templates flashjit_subprocess
    flashjit_tuner)
if(FLASHJIT_HAVE_HIP_BACKEND)
  list(APPEND flashjit_exported flashjit_hip)
  install(TARGETS flashjit_hiprtc_worker RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(TARGETS ${flashjit_exported} EXPORT flashjitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The CLI keeps the directories of the shared libraries it links (NVRTC, libLLVM) in its RPATH,
# as in the build tree.
set_target_properties(flashjit_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS flashjit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(EXPORT flashjitTargets NAMESPACE flashjit:: DESTINATION ${FLASHJIT_INSTALL_CMAKEDIR})

# What flashjitConfig.cmake must find again for the exported link interface.
get_target_property(flashjit_type flashjit TYPE)
if(flashjit_type STREQUAL "STATIC_LIBRARY")
  set(FLASHJIT_STATIC ON)
else()
  set(FLASHJIT_STATIC OFF)
endif()
if(FLASHJIT_SQLITE3_LIBRARY AND NOT SQLite3_FOUND)
  set(FLASHJIT_SQLITE3_LINKED "${FLASHJIT_SQLITE3_LIBRARY}")
else()
  set(FLASHJIT_SQLITE3_LINKED "${SQLite3_LIBRARY}")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flashjitConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/flashjitConfig.cmake
                              INSTALL_DESTINATION ${FLASHJIT_INSTALL_CMAKEDIR}
                              PATH_VARS FLASHJIT_INSTALL_TUNINGDIR)
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashjitConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flashjitConfig.cmake
              ${PROJECT_BINARY_DIR}/flashjitConfigVersion.cmake
        DESTINATION ${FLASHJIT_INSTALL_CMAKEDIR})
